"""Module paths as the user's own model names them, through the wrappers around it.

The recorder names a module by its root's class and the attribute path to it
(``DistributedDataParallel.module.blocks.0.mlp``, ``FSDPTinyGPT.blocks.0.mlp``,
tracer/recorder/attribution/modules.py). The same model wrapped another way gets another name: DDP
adds a root class and ``.module``, FSDP2's ``fully_shard`` renames the root's class ``FSDP<Class>``,
``checkpoint_wrapper`` adds ``_checkpoint_wrapped_module``, FSDP1 ``_fsdp_wrapped_module``,
torch.compile ``_orig_mod`` (the recorder drops that one already), accelerate's DeepSpeed
``DeepSpeedEngine.module`` (its other wrappers are these). trace-diff matches modules
across runs, and trace-whatif's PATTERNs match modules, on the path as ``named_modules()``
names it on the unwrapped model: no root class, no wrapper (``blocks.0.mlp``; the model's root
is ``""``). Torch-free: viz reads traces without torch.

    >>> unwrap("DistributedDataParallel.module.blocks.0.mlp")
    ModelPath(path='blocks.0.mlp', model=None, wrappers=('DDP',))
    >>> unwrap("FSDPTinyGPT.blocks.0._checkpoint_wrapped_module.mlp")
    ModelPath(path='blocks.0.mlp', model='TinyGPT', wrappers=('FSDP2', 'checkpoint_wrapper'))
"""
from __future__ import annotations

import fnmatch
import functools
import re
from dataclasses import dataclass
from typing import Iterable, Optional

# root classes that wrap the model, and the attribute that holds it
WRAPPER_ROOTS: dict[str, tuple[str, str]] = {
    "DistributedDataParallel": ("module", "DDP"),
    "DataParallel": ("module", "DataParallel"),
    "FullyShardedDataParallel": ("_fsdp_wrapped_module", "FSDP1"),
    "OptimizedModule": ("_orig_mod", "torch.compile"),
    # what accelerate's prepare() wraps in besides DDP and FSDP (accelerate.utils.other.
    # extract_model_from_parallel takes off the same ones)
    "DeepSpeedEngine": ("module", "DeepSpeed"),
}
# attributes that wrap the module below them, anywhere in a path
WRAPPER_ATTRIBUTES: dict[str, str] = {
    "_orig_mod": "torch.compile",
    "_checkpoint_wrapped_module": "checkpoint_wrapper",
    "_fsdp_wrapped_module": "FSDP1",
    "_offload_wrapped_module": "offload_wrapper",
}
# FSDP2's fully_shard makes a class FSDP<Class> (torch/distributed/fsdp/_fully_shard)
_FSDP2_CLASS = re.compile(r"^FSDP(?=[A-Z_])(\w+)$")
_NOT_MODULES = ("(no module)", "")


@dataclass(frozen=True)
class ModelPath:
    """A recorded module path unwrapped: ``path`` as ``named_modules()`` names it on the bare
    model (``""`` for its root), ``model`` the root's class where the path still says it, and
    ``wrappers`` what was taken off, outermost first."""

    path: str
    model: Optional[str]
    wrappers: tuple[str, ...] = ()


@functools.lru_cache(maxsize=65536)
def unwrap(recorded: str) -> ModelPath:
    """The module path of ``recorded`` (``Root.a.b``) on the unwrapped model. A path that names
    no module (``(no module)``, empty) comes back as it is, with no model."""
    if recorded in _NOT_MODULES:
        return ModelPath(recorded, None)
    root, *parts = recorded.split(".")
    wrappers: list[str] = []
    model: Optional[str] = root
    while root in WRAPPER_ROOTS:
        attribute, wrapper = WRAPPER_ROOTS[root]
        wrappers.append(wrapper)
        model = None
        if not parts or parts[0] != attribute:
            break                     # the wrapper's own ops, outside the model: its root
        parts = parts[1:]
        root = ""
    fsdp2 = _FSDP2_CLASS.match(model or "")
    if fsdp2:
        wrappers.append("FSDP2")
        model = fsdp2.group(1).lstrip("_") or model
    kept = []
    for part in parts:
        if part in WRAPPER_ATTRIBUTES:
            wrapper = WRAPPER_ATTRIBUTES[part]
            if wrapper not in wrappers:
                wrappers.append(wrapper)
            continue
        kept.append(part)
    return ModelPath(".".join(kept), model, tuple(wrappers))


def model_path(recorded: str) -> str:
    """Shorthand: the unwrapped path alone."""
    return unwrap(recorded).path


def wrappers_seen(recorded_paths: Iterable[str]) -> tuple[str, ...]:
    """Every wrapper taken off any of ``recorded_paths``, in first-seen order."""
    seen: dict[str, None] = {}
    for recorded in recorded_paths:
        for wrapper in unwrap(recorded).wrappers:
            seen.setdefault(wrapper, None)
    return tuple(seen)


def matches(pattern: str, path: str) -> bool:
    """Whether an unwrapped ``path`` matches ``pattern``, segment by segment: ``*`` (and any
    fnmatch wildcard) stays within one segment, ``**`` spans any number of them
    (``blocks.*`` matches ``blocks.3``, not ``blocks.3.mlp``; ``**.mlp`` matches both
    ``mlp`` and ``layers.0.mlp``). ``""`` matches the model's root alone."""
    return _match(tuple(pattern.split(".")) if pattern else (),
                  tuple(path.split(".")) if path else ())


@functools.lru_cache(maxsize=65536)
def _match(pattern: tuple[str, ...], parts: tuple[str, ...]) -> bool:
    if not pattern:
        return not parts
    head, rest = pattern[0], pattern[1:]
    if head == "**":
        return any(_match(rest, parts[i:]) for i in range(len(parts) + 1))
    return bool(parts) and fnmatch.fnmatchcase(parts[0], head) and _match(rest, parts[1:])
