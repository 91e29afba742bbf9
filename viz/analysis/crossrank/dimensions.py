"""Parallel dimensions: which one each process group carries (tp, sp, dp, pp, cp, ep), and what
each dimension's communication costs each rank.

A group's dimension comes from, in order:

1. its names, which the recorder writes into the trace's ``process_groups`` metadata: the
   DeviceMesh dimensions it is the group of (``mesh_dims``: what DeviceMesh says even of a
   group torch reuses, the world's default group for a dimension that spans the world), then
   the ``group_desc`` the user gave ``new_group`` or DeviceMesh gave the groups it made
   (``mesh_tp``, torchtitan's ``mesh_dp_shard``); the first that names a dimension
   (:func:`tracer.vocab.groups.dimension_of_desc`) gives it. The user's own names are kept
   beside it (:func:`user_names`);
2. the run's rank grid (``tracer.record_config`` of tp, cp, dp, pp; :mod:`..timeline.grid`): the one
   axis along which the group's ranks differ;
3. its ranks alone: ``world`` for a group of every rank, else ``other``.

Sequence parallelism's collectives run on tensor parallelism's group: a group named ``sp`` is
sp, but SP traffic on the TP group counts under tp. A group of one rank (a DeviceMesh dimension
of size 1) carries no traffic: its collectives are no cost of any dimension. A rank's cost per
dimension is taken over
its counted steps (:func:`..timeline.lanes.counted_steps`), each step's window as the time metrics
take it (:mod:`..timeline.metrics`, docs/metrics.md): the union of the dimension's communication
spans, the part of it overlapped by compute, and the rest, exposed. Spans of different dimensions
may overlap each other, so the dimensions' exposed times can add up to more than the rank's.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional, TypedDict

import numpy as np

from tracer.vocab.groups import dimension_of_desc, group_ranks
from tracer.vocab.strenum import StrEnum

from ..timeline.grid import AXES, Grid
from ..timeline.intervals import intersect, intervals, length, union, window
from ..timeline.lanes import RankLanes, Timeline, counted_steps

WORLD, OTHER = "world", "other"


class DimensionSource(StrEnum):
    """Where a group's dimension was read (the module docstring's three ways, in order)."""

    NAME = "name"
    GRID = "grid"
    RANKS = "ranks"


FROM_NAME, FROM_GRID, FROM_RANKS = (DimensionSource.NAME, DimensionSource.GRID,
                                    DimensionSource.RANKS)
# the group_desc torch gives groups of its own: the default group, a mesh's copy of it, the
# groups of a DeviceMesh's unnamed dimensions
_TORCH_DESCS = re.compile(r"^(default_pg|mesh_default|mesh_dim_\d+)$")


@dataclass(frozen=True)
class GroupDimension:
    """The dimension a process group carries and where that was read (FROM_NAME, FROM_GRID,
    FROM_RANKS), with the user's own names of the group and its size (1: no traffic)."""

    dimension: str
    source: DimensionSource
    desc: Optional[str] = None           # the group's group_desc, where it has one
    names: tuple[str, ...] = ()          # the user's names: mesh dimensions, their group_desc
    size: int = 0                        # its ranks; 0 where they were not resolved


@dataclass(frozen=True)
class DimensionCost:
    """One rank's communication of one dimension over its counted steps (seconds, bytes)."""

    dimension: str
    count: int
    bytes: int
    comm_s: float
    overlapped_s: float
    exposed_s: float
    names: tuple[str, ...] = ()          # the user's names of the groups it was counted on


class GroupNaming(TypedDict):
    """What the ranks' traces call a process group: a ``group_desc`` and mesh dimensions."""

    desc: Optional[str]
    mesh_dims: list[str]


def group_names(metas: Iterable[Mapping[str, Any]]) -> dict[str, GroupNaming]:
    """group text -> ``{"desc", "mesh_dims"}``, from the ``process_groups`` metadata of every
    rank's trace (the mesh dimensions of every rank that named the group)."""
    out: dict[str, GroupNaming] = {}
    for meta in metas:
        for text, entry in (meta.get("process_groups") or {}).items():
            if not isinstance(entry, dict):
                continue
            mine = out.setdefault(text, {"desc": None, "mesh_dims": []})
            desc = entry.get("desc")
            if isinstance(desc, str) and mine["desc"] is None:
                mine["desc"] = desc
            for dim in entry.get("mesh_dims") or ():
                if isinstance(dim, str) and dim not in mine["mesh_dims"]:
                    mine["mesh_dims"].append(dim)
    return out


def user_names(desc: Optional[str], mesh_dims: Iterable[str] = ()) -> tuple[str, ...]:
    """What the user called a group: its DeviceMesh dimensions, then its ``group_desc`` unless
    torch made that one (``default_pg``...) or it is DeviceMesh's ``mesh_<dimension>``."""
    names = list(dict.fromkeys(mesh_dims))
    if isinstance(desc, str) and desc and not _TORCH_DESCS.match(desc):
        name = desc[5:] if desc.startswith("mesh_") else desc
        if name not in names:
            names.append(name)
    return tuple(names)


def grid_axis(grid: Grid, ranks: tuple[int, ...]) -> Optional[str]:
    """The one grid axis along which ``ranks`` differ; None for several, none, or ranks
    outside the grid."""
    if len(ranks) < 2 or max(ranks) >= grid.world:
        return None
    coords = np.array([grid.coords(r) for r in ranks])
    varying = [AXES[i] for i in range(len(AXES)) if len(set(coords[:, i].tolist())) > 1]
    return varying[0] if len(varying) == 1 else None


def dimension_label(dimension: str, names: Iterable[str]) -> str:
    """A dimension with the user's own names of its groups beside it, ``dp (dp_shard,
    my_data_parallel)``; the dimension alone where the user's name is the dimension's."""
    own = [n for n in dict.fromkeys(names) if n != dimension]
    return f"{dimension} ({', '.join(own)})" if own else dimension


def name_groups(texts: Iterable[str], names: Mapping[str, GroupNaming], grid: Optional[Grid],
                world: int) -> dict[str, GroupDimension]:
    """group text -> :class:`GroupDimension`, for every recorded group text; ``names``: text ->
    ``{"desc", "mesh_dims"}`` (:func:`group_names`)."""
    out = {}
    for text in texts:
        entry = names.get(text)
        desc = entry.get("desc") if entry is not None else None
        mesh_dims = tuple(entry.get("mesh_dims") or ()) if entry is not None else ()
        mine = user_names(desc, mesh_dims)
        ranks = group_ranks(text)
        named = next((d for d in map(dimension_of_desc, mesh_dims + (desc,)) if d), None)
        axis = grid_axis(grid, ranks) if grid is not None and named is None else None
        if named is not None:
            dimension, source = named, FROM_NAME
        elif axis is not None:
            dimension, source = axis, FROM_GRID
        elif ranks and world and sorted(ranks) == list(range(world)):
            dimension, source = WORLD, FROM_RANKS
        else:
            dimension, source = OTHER, FROM_RANKS
        out[text] = GroupDimension(dimension, source, desc, mine, len(ranks))
    return out


def dimension_costs(timeline: Timeline, names: Mapping[str, GroupDimension],
                    steps: Optional[frozenset[int]] = None) -> dict[int, list[DimensionCost]]:
    """rank -> [DimensionCost], most exposed first, for every rank of the timeline; over
    ``steps`` where given (trace-diff's compared steps), else each rank's counted steps."""
    return {rank: _rank_costs(lane, names, steps) for rank, lane in timeline.ranks.items()}


def _rank_costs(lane: RankLanes, names: Mapping[str, GroupDimension],
                steps: Optional[frozenset[int]] = None) -> list[DimensionCost]:
    comm = lane.comm
    if not len(comm):
        return []
    counted = set(counted_steps(lane)) if steps is None else set(steps) & set(lane.steps)
    step, start, end = comm.column("step"), comm.column("start"), comm.column("end")
    nbytes = comm.column("nbytes")
    groups = comm.tables.get("group", [])        # a text field: codes into its table
    dims = np.array([names[g].dimension if g in names else OTHER for g in groups] or [OTHER])
    dim_of = dims[comm.columns["group"]] if groups else np.full(len(comm), OTHER)
    # a group of one rank moves nothing: no dimension's traffic
    alone = np.array([g in names and names[g].size == 1 for g in groups] or [False])
    in_steps = np.isin(step, list(counted))
    if groups:
        in_steps &= ~alone[comm.columns["group"]]
    # on the device clock a span that launched no GPU work is host time only: no
    # communication on the device (as the rank's comm_union leaves it out)
    host_only = np.array([v is False for v in comm.values("on_gpu")], dtype=bool)
    timed = in_steps & ~host_only
    costs = []
    for dim in sorted(set(dim_of[in_steps].tolist())):
        mine = dim_of == dim
        spans = union(intervals(start[mine & timed], end[mine & timed]))
        comm_ns = overlapped = 0
        for s in sorted(counted):
            if s not in lane.steps:
                continue
            lo, hi = lane.steps[s]
            part = window(spans, lo, hi)
            comm_ns += length(part)
            overlapped += length(intersect(part, window(lane.compute, lo, hi)))
        counted_mine = mine & in_steps
        used = sorted(set(comm.columns["group"][counted_mine].tolist())) if groups else []
        mine_names = tuple(dict.fromkeys(n for g in used if groups[g] in names
                                         for n in names[groups[g]].names))
        costs.append(DimensionCost(dim, int(counted_mine.sum()),
                                   int(nbytes[counted_mine].sum()), comm_ns / 1e9,
                                   overlapped / 1e9, (comm_ns - overlapped) / 1e9, mine_names))
    return sorted(costs, key=lambda c: (-c.exposed_s, c.dimension))
