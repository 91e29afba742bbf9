"""Collectives of a torch.profiler export: kind, process group, bytes, dtype, peer, sequence.

Kineto says what a collective was in several places, depending on the torch version and the
backend; this module reads each, most exact first:

- ``record_param_comms`` (NCCL, and gloo in some versions): ``Collective name``, ``dtype``,
  ``In msg nelems``, ``Process Group Name`` / ``Process Group Ranks`` (or ``Global rank
  start`` / ``stride`` / ``Group size``), ``Seq`` in newer versions;
- the dispatched ``c10d::`` op around it (``c10d::allreduce_``, ``c10d::send`` ...): its kind
  from the op's name, its tensors from ``Input Dims``, a peer or root from ``Concrete Inputs``
  at the op schema's position;
- a ``nccl:<kind>`` or ``gloo:<kind>`` range inside it, and for gloo the tensors' dtype from
  its ``gloo:<kind>`` range on the worker thread, in issue order;
- the process groups of ``distributedInfo.pg_config``.

What none of them says stays unknown (null in the trace): a collective's bytes without a
dtype, a peer without one recorded, a group that is not in pg_config. Sequence numbers are
the export's ``Seq`` where it has one, else counted per group in launch order, as a recording
counts them; exports of the same steps then match across ranks. Torch-free.
"""
from __future__ import annotations

import re
from typing import Any, Optional

from tracer.vocab import ops
from tracer.vocab.groups import group_ranks, group_text

from .events import CPP_DTYPES

# Kineto's dtype text -> (paratrace's short dtype, bytes per element)
_DTYPE: dict[str, tuple[Optional[str], int]] = {
    "Float": ("f32", 4), "Double": ("f64", 8), "Half": ("f16", 2), "BFloat16": ("bf16", 2),
    "Long": ("i64", 8), "Int": ("i32", 4), "Short": ("i16", 2), "Char": ("i8", 1),
    "Byte": ("u8", 1), "Bool": ("b8", 1), "ComplexFloat": ("c64", 8),
    "ComplexDouble": ("c128", 16), "Float8_e4m3fn": ("f8e4m3", 1), "Float8_e5m2": ("f8e5m2", 1),
    "f32": ("f32", 4), "f64": ("f64", 8), "f16": ("f16", 2), "bf16": ("bf16", 2),
    "i64": ("i64", 8), "i32": ("i32", 4), "i16": ("i16", 2), "i8": ("i8", 1), "u8": ("u8", 1),
    "b8": ("b8", 1)}
# c10d op -> position of its peer / root rank (group-local) in the op schema
_PEER_AT = {"send": 2, "recv_": 2, "broadcast_": 2, "reduce_": 3, "gather_": 3,
            "scatter_": 3}
_KERNEL_KIND = (("AllReduce", "all_reduce"), ("AllGather", "all_gather"),
                ("ReduceScatter", "reduce_scatter"), ("Broadcast", "broadcast"),
                ("Reduce", "reduce"), ("AllToAll", "all_to_all"))
_NUMBERS = re.compile(r"-?\d+")


def dtype_of(name: Any) -> tuple[Optional[str], int]:
    """(paratrace's short dtype, bytes per element) of Kineto's dtype text: a ScalarType name
    (``Float``, record_param_comms) or a C++ type (``float``, ``Input type``); (None, 0) if
    unknown."""
    if not name:
        return None, 0
    name = str(name)
    return _DTYPE.get(name.replace("c10::", "")) or _DTYPE.get(CPP_DTYPES.get(name, ""),
                                                                (None, 0))


def kind_of_name(name: str) -> Optional[str]:
    """The kind a ``c10d::`` op, a ``Collective name`` or a ``nccl:``/``gloo:`` range names."""
    base = name.split("::", 1)[1] if "::" in name else name.split(":", 1)[-1]
    return ops.kind_of(base.strip())


def kind_of_kernel(name: str) -> Optional[str]:
    """The kind an NCCL kernel's name says (``ncclDevKernel_AllGather_RING_LL``); None for
    SendRecv, which does not say which side."""
    for word, kind in _KERNEL_KIND:
        if word in name:
            return kind
    return None


def ranks_text(value: Any) -> Optional[tuple[int, ...]]:
    """``"[0, 1]"`` or ``[0, 1]`` -> (0, 1); None when it is not a list of ranks."""
    if isinstance(value, list):
        found = [v for v in value if type(v) is int]
        return tuple(found) if found and len(found) == len(value) else None
    if isinstance(value, str):
        found = [int(x) for x in _NUMBERS.findall(value)]
        return tuple(found) if found else None
    return None


class ProcessGroups:
    """The export's process groups (``distributedInfo.pg_config``) and the trace's text of
    each: its ranks, ``ranks@name`` for a group over the same ranks as an earlier one, as the
    recorder writes them (docs/trace-format.md)."""

    def __init__(self, info: dict[str, Any]) -> None:
        self.by_name: dict[str, str] = {}
        # ranks -> the name of the first group over them
        self._first: dict[tuple[int, ...], Optional[str]] = {}
        config = info.get("pg_config") if isinstance(info, dict) else None
        for pg in config if isinstance(config, list) else ():
            if isinstance(pg, dict):
                ranks = ranks_text(pg.get("ranks"))
                if ranks:
                    self.add(str(pg.get("pg_name")), ranks)
        world = info.get("world_size") if isinstance(info, dict) else None
        self.world = world if type(world) is int and world > 0 else None
        self.only = next(iter(self.by_name.values())) if len(self.by_name) == 1 else None

    def add(self, name: Optional[str], ranks: tuple[int, ...]) -> str:
        self._first.setdefault(ranks, name)
        text = group_text(ranks, name=None if self._first[ranks] == name else name)
        if name is not None:
            self.by_name.setdefault(name, text)
        return text

    def of(self, args: dict[str, Any]) -> str:
        """The group text of a collective's arguments; the only group of a one-group export
        when they name none; ``?`` when unknown."""
        name = args.get("Process Group Name", args.get("Process Group ID"))
        name = None if name is None else str(name)
        ranks = ranks_text(args.get("Process Group Ranks"))
        if ranks is None:
            start, stride, size = (args.get(k) for k in ("Global rank start",
                                                           "Global rank stride", "Group size"))
            if type(start) is int and type(stride) is int and type(size) is int \
                    and size > 0 and stride > 0:
                ranks = tuple(range(start, start + stride * size, stride))
        if ranks is not None:
            known = self.by_name.get(name) if name is not None else None
            return known or self.add(name, ranks)
        if name is not None and name in self.by_name:
            return self.by_name[name]
        return self.only or "?"


def elements(dims: Any) -> Optional[int]:
    """Elements of the tensors of an ``Input Dims`` entry (a tensor, or a list of them)."""
    if not isinstance(dims, list):
        return None
    if dims and isinstance(dims[0], list):
        parts = [elements(d) for d in dims]
        known = [p for p in parts if p is not None]
        return sum(known) if len(known) == len(parts) else None
    n = 1
    for d in dims:
        if type(d) is not int or d < 0:
            return None
        n *= d
    return n


def peer_of(op: str, args: dict[str, Any], group: str) -> Optional[int]:
    """The global rank of a c10d op's peer or root, from its ``Concrete Inputs``."""
    at = _PEER_AT.get(op.split("::", 1)[-1])
    inputs = args.get("Concrete Inputs")
    if at is None or not isinstance(inputs, list) or at >= len(inputs):
        return None
    try:
        local = int(inputs[at])
    except (TypeError, ValueError):
        return None
    ranks = group_ranks(group)
    if not ranks:
        return local if local >= 0 else None
    return ranks[local] if 0 <= local < len(ranks) else None


def tensor_input(args: dict[str, Any]) -> tuple[Optional[int], Any]:
    """(elements, Kineto dtype text) of a c10d op's first tensor argument."""
    dims, types = args.get("Input Dims"), args.get("Input type")
    if not isinstance(dims, list) or not isinstance(types, list):
        return None, None
    for d, t in zip(dims, types):
        if isinstance(d, list) and d:
            return elements(d), (None if t in ("TensorList", "", None) else t)
    return None, None
