"""A model's parameters as the recording saw them (the trace's ``parameters`` metadata,
tracer/recorder/attribution/parameters.py), on the unwrapped model's module paths
(tracer.vocab.model_paths), and what each data-parallel sharding makes of them:

- FSDP2's units (the repeated blocks by default: the items of a ModuleList or ModuleDict, as
  torchtitan and Hugging Face hold their layers; plus the root), and per unit the bytes of its
  all-gather input (each parameter's dim-0 shard padded to ceil(dim0 / N) rows, FSDP2's
  ``_chunk_with_empty``) and of its reduce-scatter input (N times that);
- DDP's gradient buckets after its rebuild (torch's ``compute_bucket_assignment_by_size``:
  parameters in the order their gradients became ready, the first bucket closed at 1 MiB,
  the others at 25 MiB);
- ZeroRedundancyOptimizer's partition (largest parameters first, each to the rank with the
  fewest elements so far).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from tracer.vocab.model_paths import matches, model_path

DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2,
               "float64": 8, "double": 8, "complex64": 8, "complex128": 16, "int64": 8,
               "long": 8, "int32": 4, "int": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1,
               "float8_e4m3fn": 1, "float8_e5m2": 1}
FIRST_BUCKET = 1024 * 1024              # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
BUCKET = 25 * 1024 * 1024               # DDP's default bucket_cap_mb
ROOT = ""                               # the model's root module path


def itemsize(dtype: str) -> int:
    return DTYPE_BYTES.get(dtype, 4)


@dataclass(frozen=True)
class Param:
    """One parameter: its path on the unwrapped model (``layers.0.attention.wq.weight``), its
    module's, its global shape and dtype; a DTensor's placements, local shape and mesh."""

    name: str
    module: str
    shape: tuple
    dtype: str
    trainable: bool = True
    placements: Optional[tuple] = None
    local_shape: Optional[tuple] = None
    mesh: Optional[tuple] = None         # ((dim names), (sizes))

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * itemsize(self.dtype)

    def padded_shard(self, n: int) -> int:
        """Elements of one rank's FSDP2 shard over ``n`` ranks, padded: ceil(dim0 / n) rows."""
        if not self.shape:
            return 1
        rows = self.shape[0]
        return -(-rows // n) * (self.numel // rows if rows else 0)

    def local_shard(self, n: int, rank: int) -> int:
        """Elements rank ``rank`` of ``n`` holds of it, unpadded (torch.chunk's split)."""
        if not self.shape:
            return 1 if rank == 0 else 0
        rows = self.shape[0]
        per = -(-rows // n)
        mine = max(min(per, rows - rank * per), 0)
        return mine * (self.numel // rows if rows else 0)


@dataclass(frozen=True)
class Buffer:
    name: str
    module: str
    shape: tuple
    dtype: str

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * itemsize(self.dtype)


def _parent(name: str) -> str:
    return name.rpartition(".")[0]


@dataclass
class Layout:
    """The parameters (in ``named_parameters()`` order) and buffers of a model."""

    params: list
    buffers: list

    @classmethod
    def from_meta(cls, meta: dict) -> "Layout":
        """From a trace's ``parameters`` metadata: root path -> its lists."""
        params, buffers, seen = [], [], set()
        for root, entry in meta.items():
            for name, shape, dtype, trainable, placements, local, mesh in \
                    entry.get("parameters") or []:
                path = model_path(f"{root}.{name}")
                if path in seen:
                    continue
                seen.add(path)
                params.append(Param(path, _parent(path), tuple(shape), dtype, bool(trainable),
                                    tuple(placements) if placements else None,
                                    tuple(local) if local else None,
                                    (tuple(mesh[0]), tuple(mesh[1])) if mesh else None))
            for name, shape, dtype in entry.get("buffers") or []:
                path = model_path(f"{root}.{name}")
                if path not in seen:
                    seen.add(path)
                    buffers.append(Buffer(path, _parent(path), tuple(shape), dtype))
        return cls(params, buffers)

    @property
    def trainable(self) -> list:
        return [p for p in self.params if p.trainable]

    def modules(self) -> list:
        """Every module path that holds a parameter or buffer, and their ancestors."""
        out = {ROOT}
        for name in [p.name for p in self.params] + [b.name for b in self.buffers]:
            parts = name.split(".")[:-1]
            out.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
        return sorted(out)

    def repeated_blocks(self) -> list:
        """The outermost items of a container: siblings named 0, 1, ... (at least two)."""
        children: dict = {}
        for path in self.modules():
            parent, _, leaf = path.rpartition(".")
            if leaf.isdigit() and path:
                children.setdefault(parent, []).append(path)
        out = []
        for parent in sorted(children, key=lambda p: (p.count("."), p)):
            items = children[parent]
            if len(items) < 2 or any(parent == o or parent.startswith(o + ".") for o in out):
                continue
            out += sorted(items, key=lambda p: int(p.rpartition(".")[2]))
        return [p for p in out if not any(p != o and p.startswith(o + ".") for o in out)]

    def units(self, pattern: Optional[str] = None) -> list:
        """FSDP2 units: the modules matching ``pattern`` (comma-separated PATTERNs; the
        outermost of nested matches), else the repeated blocks; the root last."""
        if pattern:
            found = [m for m in self.modules()
                     if m and any(matches(p, m) for p in pattern.split(","))]
            found = [m for m in found if not any(m.startswith(o + ".") for o in found)]
        else:
            found = self.repeated_blocks()
        return found + [ROOT]

    def unit_of(self, name: str, units: list) -> str:
        """The innermost unit that holds parameter or buffer ``name``."""
        best = ROOT
        for unit in units:
            if unit and (name.startswith(unit + ".")) and len(unit) > len(best):
                best = unit
        return best

    def unit_params(self, units: list) -> dict:
        """unit -> its trainable parameters (units holding none left out)."""
        out: dict = {}
        for p in self.params:
            out.setdefault(self.unit_of(p.name, units), []).append(p)
        return {u: ps for u, ps in out.items() if ps}


def fsdp_bytes(params: list, n: int, dtype: Optional[str] = None) -> int:
    """Bytes one rank hands to a unit's all-gather over ``n`` ranks (its padded shard), in
    ``dtype`` (mixed precision's param_dtype) or each parameter's own."""
    return sum(p.padded_shard(n) * itemsize(dtype or p.dtype) for p in params)


def ddp_buckets(params: list, first: int = FIRST_BUCKET, cap: int = BUCKET) -> list:
    """Bytes of each gradient bucket DDP all-reduces, in launch order, for ``params`` in the
    order their gradients become ready (torch's compute_bucket_assignment_by_size, per
    dtype: a bucket closes once it holds ``first`` bytes, the later ones ``cap``)."""
    open_: dict = {}
    limits: dict = {}
    out = []
    for p in params:
        size = open_.get(p.dtype, 0) + p.nbytes
        limit = limits.get(p.dtype, first)
        if size >= limit:
            out.append(size)
            open_[p.dtype], limits[p.dtype] = 0, cap
        else:
            open_[p.dtype] = size
    return out + [size for size in open_.values() if size]


def zero_partition(params: list, n: int) -> list:
    """The parameters ZeroRedundancyOptimizer gives each of ``n`` ranks, in order."""
    sizes, out = [0] * n, [[] for _ in range(n)]
    for p in sorted(params, key=lambda q: q.numel, reverse=True):
        rank = sizes.index(min(sizes))
        out[rank].append(p)
        sizes[rank] += p.numel
    return out
