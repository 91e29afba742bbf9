"""Parallel dimensions: which one each process group carries (tp, sp, dp, pp, cp, ep), and what
each dimension's communication costs each rank.

A group's dimension comes from, in order:

1. its name: the ``group_desc`` the user gave ``new_group`` or DeviceMesh gave the groups of
   a named mesh dimension (``mesh_tp``, torchtitan's ``mesh_dp_shard``), which the recorder
   writes into the trace's ``process_groups`` metadata
   (:func:`tracer.vocab.groups.dimension_of_desc` reads it);
2. the run's rank grid (``tracer.record_config`` of tp, cp, dp, pp; :mod:`.grid`): the one
   axis along which the group's ranks differ;
3. its ranks alone: ``world`` for a group of every rank, else ``other``.

Sequence parallelism's collectives run on tensor parallelism's group: a group named ``sp`` is
sp, but SP traffic on the TP group counts under tp. A rank's cost per dimension is taken over
its counted steps (:func:`.lanes.counted_steps`), each step's window as the time metrics take
it (:mod:`.metrics`, docs/metrics.md): the union of the dimension's communication spans, the
part of it overlapped by compute, and the rest, exposed. Spans of different dimensions may
overlap each other, so the dimensions' exposed times can add up to more than the rank's.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional

import numpy as np

from tracer.vocab.groups import dimension_of_desc, group_ranks

from .grid import AXES, Grid
from .intervals import intersect, intervals, length, union, window
from .lanes import RankLanes, Timeline, counted_steps

WORLD, OTHER = "world", "other"
FROM_NAME, FROM_GRID, FROM_RANKS = "name", "grid", "ranks"


@dataclass(frozen=True)
class GroupDimension:
    """The dimension a process group carries and where that was read (FROM_NAME, FROM_GRID,
    FROM_RANKS)."""

    dimension: str
    source: str
    desc: Optional[str] = None           # the group's own name, where it has one


@dataclass(frozen=True)
class DimensionCost:
    """One rank's communication of one dimension over its counted steps (seconds, bytes)."""

    dimension: str
    count: int
    bytes: int
    comm_s: float
    overlapped_s: float
    exposed_s: float


def group_descs(metas: Iterable[dict]) -> dict:
    """group text -> its name, from the ``process_groups`` metadata of every rank's trace."""
    out: dict = {}
    for meta in metas:
        for text, entry in (meta.get("process_groups") or {}).items():
            desc = entry.get("desc") if isinstance(entry, dict) else None
            if isinstance(desc, str):
                out.setdefault(text, desc)
    return out


def grid_axis(grid: Grid, ranks: tuple) -> Optional[str]:
    """The one grid axis along which ``ranks`` differ; None for several, none, or ranks
    outside the grid."""
    if len(ranks) < 2 or max(ranks) >= grid.world:
        return None
    coords = np.array([grid.coords(r) for r in ranks])
    varying = [AXES[i] for i in range(len(AXES)) if len(set(coords[:, i].tolist())) > 1]
    return varying[0] if len(varying) == 1 else None


def name_groups(texts: Iterable[str], descs: dict, grid: Optional[Grid],
                world: int) -> dict:
    """group text -> :class:`GroupDimension`, for every recorded group text."""
    out = {}
    for text in texts:
        desc = descs.get(text)
        named = dimension_of_desc(desc)
        ranks = group_ranks(text)
        if named is not None:
            out[text] = GroupDimension(named, FROM_NAME, desc)
            continue
        axis = grid_axis(grid, ranks) if grid is not None else None
        if axis is not None:
            out[text] = GroupDimension(axis, FROM_GRID, desc)
        elif ranks and world and sorted(ranks) == list(range(world)):
            out[text] = GroupDimension(WORLD, FROM_RANKS, desc)
        else:
            out[text] = GroupDimension(OTHER, FROM_RANKS, desc)
    return out


def dimension_costs(timeline: Timeline, names: dict, steps: Optional[frozenset] = None
                    ) -> dict:
    """rank -> [DimensionCost], most exposed first, for every rank of the timeline; over
    ``steps`` where given (trace-diff's compared steps), else each rank's counted steps."""
    return {rank: _rank_costs(lane, names, steps) for rank, lane in timeline.ranks.items()}


def _rank_costs(lane: RankLanes, names: dict, steps: Optional[frozenset] = None) -> list:
    comm = lane.comm
    if not len(comm):
        return []
    counted = set(counted_steps(lane)) if steps is None else set(steps) & set(lane.steps)
    step, start, end = comm.column("step"), comm.column("start"), comm.column("end")
    nbytes = comm.column("nbytes")
    groups = comm.tables.get("group", [])        # a text field: codes into its table
    dims = np.array([names[g].dimension if g in names else OTHER for g in groups] or [OTHER])
    dim_of = dims[comm.columns["group"]] if groups else np.full(len(comm), OTHER)
    in_steps = np.isin(step, list(counted))
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
        costs.append(DimensionCost(dim, int(counted_mine.sum()),
                                   int(nbytes[counted_mine].sum()), comm_ns / 1e9,
                                   overlapped / 1e9, (comm_ns - overlapped) / 1e9))
    return sorted(costs, key=lambda c: (-c.exposed_s, c.dimension))
