"""Process groups as a trace records them: the global ranks as text, ``"0,2"``, and torch's
group name after ``@`` where several groups span the same ranks (``"0,2@5"``). The recorder
writes these texts; the analyses read ranks and names back from them.
"""
from __future__ import annotations

from typing import Optional, Sequence

GROUP_NAME_SEP = "@"


def group_text(ranks: Sequence[int], key: object = None, name: Optional[str] = None) -> str:
    """The trace's text of a process group: its global ranks, ``"0,2"``; ``"0,2@<name>"`` for
    a process group over the same ranks as an earlier one (``name``: torch's group name);
    ``"?<key>"`` when the recorder could not resolve them."""
    if not ranks:
        return f"?{key}"
    text = ",".join(map(str, ranks))
    return f"{text}{GROUP_NAME_SEP}{name}" if name is not None else text


def group_ranks(text: Optional[str]) -> tuple[int, ...]:
    """Global ranks of a recorded process group text; () when it was not resolved."""
    if not text or text.startswith("?"):
        return ()
    return tuple(int(r) for r in text.split(GROUP_NAME_SEP, 1)[0].split(","))


def process_group_name(text: Optional[str]) -> Optional[str]:
    """torch's name of a recorded process group, where the trace keeps it (one of several over
    the same ranks); else None."""
    return text.split(GROUP_NAME_SEP, 1)[1] if text and GROUP_NAME_SEP in text else None


def group_label(text: Optional[str]) -> str:
    """A recorded process group for people: ``0,1``, or ``0,1 (process group 2)`` for one of
    several over the same ranks."""
    name = process_group_name(text)
    if text is None or name is None:
        return text or ""
    return f"{text.split(GROUP_NAME_SEP, 1)[0]} (process group {name})"


# The parallel dimensions a process group can carry, and the words that name each in a
# group_desc or a DeviceMesh dimension name (torchtitan's dp_shard, dp_replicate, dp_shard_cp;
# Megatron's tensor/pipeline/data/context/expert model parallel groups)
DIMENSIONS = ("tp", "sp", "dp", "pp", "cp", "ep")
_DIMENSION_WORDS = {
    "tp": "tp", "tensor": "tp", "mp": "tp",
    "sp": "sp", "sequence": "sp",
    "dp": "dp", "data": "dp", "ddp": "dp", "fsdp": "dp", "hsdp": "dp", "zero": "dp",
    "replicate": "dp", "shard": "dp",
    "pp": "pp", "pipe": "pp", "pipeline": "pp", "stage": "pp",
    "cp": "cp", "context": "cp", "ring": "cp",
    "ep": "ep", "expert": "ep", "moe": "ep",
}


def dimension_of_desc(desc: Optional[str]) -> Optional[str]:
    """The parallel dimension a group's name says (``group_desc``, or ``mesh_<dim>`` as
    DeviceMesh names its groups): the first word of it that names one, ``dp_shard_cp`` -> dp,
    ``mesh_tp`` -> tp, ``pp_grad`` -> pp; None for torch's own names (``default_pg``,
    ``mesh_default``) and words that name none."""
    if not isinstance(desc, str):
        return None
    text = desc.lower()
    if text.startswith("mesh_"):
        text = text[5:]
    word = ""
    for ch in text + "_":
        if ch.isalpha():
            word += ch
            continue
        if word in _DIMENSION_WORDS:
            return _DIMENSION_WORDS[word]
        word = ""
    return None
