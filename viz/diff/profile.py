"""Profiles: what one rank (or a set of ranks) of a run did, in the terms a diff compares.

A :class:`Profile` splits into *structure* (exact multisets that only change when the code or
the parallel layout changes) and *measures* (FLOPs and bytes, derived from recorded shapes, and
time, which differs on every run):

- ``ops``: calls per (module path with layer indices, op overload, phase), the path as the
  unwrapped model names it (:mod:`tracer.vocab.model_paths`: DDP's ``.module``, FSDP2's
  ``FSDP<Class>``, checkpoint and compile wrappers taken off; the model's root is
  :data:`MODEL_ROOT`), so the same model wrapped two ways matches;
- ``functions``: ops issued at or below each call-graph function node, keyed by its qualified
  name and short file path (never a line number: lines shift with every edit);
- ``comm``: calls and bytes per (communication kind, phase, process group), the group named by
  the grid axes it spans and its size (:func:`viz.diff.roles.group_label`);
- ``module_comm``: collective calls per (module path, kind, phase): which layer communicates how
  (it follows from ``ops``, as each op has one kind, so it adds no structure of its own);
- ``flops`` per op family, ``op_counts`` per op, ``time`` from the timeline analysis;
- ``dimensions``: per parallel dimension (viz.analysis.crossrank.dimensions), calls and bytes over
  the compared steps, and its exposed and overlapped seconds;
- ``memory``: where memory was recorded, the most bytes live at once over the compared steps
  and what was live then by category.

Profiles are pure functions of :class:`viz.analysis.callgraphs.callgraph.OpGroup` s and
:class:`viz.analysis.timeline.rank_lanes.RankMetrics`.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, Optional, Sequence

from tracer.vocab.model_paths import model_path

from ..analysis.callgraphs.flops import base_name
from ..analysis.callgraphs.module_tree import NO_MODULE
from ..analysis.callgraphs.op_groups import Frame, OpGroup

MATMUL_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "matmul", "linear"})
TIME_METRICS = ("wall_s", "compute_s", "comm_s", "exposed_comm_s", "idle_s",
                "overlap_fraction", "bubble_fraction", "pipeline_bubble_fraction",
                "pipeline_bubble_replayed", "theoretical_bubble_fraction")
MODEL_ROOT = "(model)"       # the unwrapped model's root module: its own ops, its wrapper's
_DIRECT = ("wall_s", "compute_s", "comm_s", "exposed_comm_s", "idle_s", "overlap_fraction",
           "bubble_fraction", "theoretical_bubble_fraction")


def flop_family(op: str) -> str:
    """``matmul`` for the GEMMs, ``attention`` for fused attention, ``other`` otherwise."""
    base = base_name(op)
    if base in MATMUL_OPS:
        return "matmul"
    if "scaled_dot_product" in base:
        return "attention"
    return "other"


def module_key(recorded: str) -> str:
    """A recorded module path as a diff compares it: on the unwrapped model, the root
    :data:`MODEL_ROOT`; ops outside every module :data:`NO_MODULE`."""
    if not recorded or recorded == NO_MODULE:
        return NO_MODULE
    return model_path(recorded) or MODEL_ROOT


def function_key(frame: Frame, paths: Mapping[str, str]) -> str:
    """A call-graph function node's identity across runs: short file path and qualified name."""
    return f"{paths.get(frame.file, frame.file)}:{frame.qualname}"


@dataclass(frozen=True)
class Memory:
    """The most bytes live at once on ``rank`` (the largest over a profile's ranks) and what
    was live then by category."""

    rank: int
    peak_bytes: int
    by_category: dict


@dataclass
class Profile:
    """What ``ranks`` of one run did (summed over them; time averaged over them)."""

    ranks: tuple
    ops: Counter = field(default_factory=Counter)         # (module, op, phase) -> calls
    functions: Counter = field(default_factory=Counter)   # function key -> ops at or below
    comm: Counter = field(default_factory=Counter)        # (kind, phase, group) -> calls
    comm_bytes: Counter = field(default_factory=Counter)  # (kind, phase, group) -> bytes
    module_comm: Counter = field(default_factory=Counter)  # (module, kind, phase) -> calls
    op_counts: Counter = field(default_factory=Counter)   # op -> calls
    flops: Counter = field(default_factory=Counter)       # family -> FLOPs, and "total"
    time: dict = field(default_factory=dict)              # TIME_METRICS -> value or None
    steps: tuple = ()
    dim_calls: Counter = field(default_factory=Counter)   # dimension -> calls
    dim_bytes: Counter = field(default_factory=Counter)   # dimension -> bytes
    dim_time: dict = field(default_factory=dict)  # (dimension, "exposed_s" | ...) -> seconds
    time_steps: int = 0                   # how many steps ``time`` and ``dim_time`` sum
    memory: Optional[Memory] = None       # None: memory not recorded (on some rank)
    dim_names: Counter = field(default_factory=Counter)   # (dimension, user's name) -> ranks


def rank_profile(rank: int, groups: Iterable[OpGroup], comm_rows: Iterable,
                 paths: Mapping[str, str], metrics, steps: Sequence[int],
                 group_name: Callable[[list], str], dimensions: Sequence = (),
                 memory: Optional[Memory] = None) -> Profile:
    """The profile of one rank from its OpGroups, its communication rows
    (:class:`viz.analysis.rank.CommRow`: op groups do not carry the process group), display paths of
    its files, its RankMetrics over the compared steps (None if the timeline has none) and how
    to name a group's ranks; ``dimensions``: its viz.analysis.crossrank.dimensions.DimensionCost s
    over the same steps; ``memory``: its peak there, where memory was recorded."""
    out = Profile((rank,), steps=tuple(steps), memory=memory,
                  time_steps=len(metrics.counted_steps) if metrics is not None else 0)
    for cost in dimensions:
        out.dim_calls[cost.dimension] += cost.count
        out.dim_bytes[cost.dimension] += cost.bytes
        out.dim_time[(cost.dimension, "exposed_s")] = cost.exposed_s
        out.dim_time[(cost.dimension, "overlapped_s")] = cost.overlapped_s
        out.dim_names.update((cost.dimension, name) for name in cost.names)
    for row in comm_rows:
        key = (row.kind, row.phase, group_name(row.group))
        out.comm[key] += row.count
        out.comm_bytes[key] += row.bytes
    for grp in groups:
        module = module_key(grp.module)
        out.ops[(module, grp.op, grp.phase)] += grp.count
        out.op_counts[grp.op] += grp.count
        for key in {function_key(f, paths) for f in grp.path}:
            out.functions[key] += grp.count
        if grp.kind:
            out.module_comm[(module, grp.kind, grp.phase)] += grp.count
        if grp.flops:
            out.flops[flop_family(grp.op)] += grp.flops
            out.flops["total"] += grp.flops
    out.time = time_of(metrics)
    return out


def time_of(metrics) -> dict:
    """The time metrics a diff shows, from a RankMetrics (None values when there is none)."""
    if metrics is None:
        return {k: None for k in TIME_METRICS}
    out = {k: getattr(metrics, k) for k in _DIRECT}
    pipe = metrics.pipeline
    out["pipeline_bubble_fraction"] = pipe.bubble_fraction if pipe is not None else None
    out["pipeline_bubble_replayed"] = pipe.simulated_bubble_fraction if pipe is not None \
        else None
    return out


def merge(profiles: Sequence[Profile]) -> Profile:
    """Counts summed over the profiles, time metrics averaged over those that have them."""
    out = Profile(tuple(sorted(r for p in profiles for r in p.ranks)))
    for p in profiles:
        for name in ("ops", "functions", "comm", "comm_bytes", "module_comm", "op_counts",
                     "flops", "dim_calls", "dim_bytes", "dim_names"):
            getattr(out, name).update(getattr(p, name))
    # a dimension's seconds: the mean over the ranks, 0 for a rank without it
    for key in {k for p in profiles for k in p.dim_time}:
        out.dim_time[key] = sum(p.dim_time.get(key, 0.0) for p in profiles) / len(profiles)
    for key in TIME_METRICS:
        values = [p.time.get(key) for p in profiles if p.time.get(key) is not None]
        out.time[key] = sum(values) / len(values) if values else None
    out.steps = tuple(sorted({s for p in profiles for s in p.steps}))
    out.time_steps = max((p.time_steps for p in profiles), default=0)
    # the largest rank's peak: the one that runs out of memory first; unknown if any is
    if profiles and all(p.memory is not None for p in profiles):
        out.memory = max((p.memory for p in profiles), key=lambda m: (m.peak_bytes, -m.rank))
    return out
