"""Time metrics of a timeline: per rank and step, compute, communication, exposed communication,
idle time, overlap and bubbles, the pipeline bubble split into warm-up, steady state and
cool-down, the papers' theoretical bubble beside the measurement, and the replayed bubble
(:mod:`viz.analysis.timeline.replay`). Definitions and worked examples: docs/metrics.md.

Every query of a rank's compute inside a window goes through an index (:class:`_Index`), so the
whole analysis is O(n log n) in the events of a step, however many steps and passes a run has.
"""
from __future__ import annotations

import bisect
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Generic, Optional, TypeVar

import numpy as np

from .intervals import Prefix, intersect, intervals, length, union, window
from .lanes import Pass, RankLanes, Timeline, counted_steps
from .replay import replayed_bubbles

_V = TypeVar("_V")


@dataclass(frozen=True)
class PipelineBubble:
    """Pipeline bubble of one rank: time in the pipeline window not spent computing a pass."""

    window_s: float
    bubble_s: float
    bubble_fraction: Optional[float]
    warmup_fraction: Optional[float]
    steady_fraction: Optional[float]
    cooldown_fraction: Optional[float]
    simulated_bubble_fraction: Optional[float] = None   # same passes, free communication
    theoretical_bubble_fraction: Optional[float] = None  # the papers' formula for the schedule


@dataclass(frozen=True)
class StepMetrics:
    """Time metrics of one rank in one step window."""

    step: int
    start: int
    end: int
    wall_s: float
    compute_s: float
    comm_s: float
    overlapped_comm_s: float
    exposed_comm_s: float
    idle_s: float
    overlap_fraction: Optional[float]
    bubble_fraction: Optional[float]
    pipeline: Optional[PipelineBubble]
    memory_s: float = 0.0            # device clock: memcpys and memsets, never compute
    phase_s: dict[str, float] = field(default_factory=dict)  # phase -> seconds (host; .phase_time)


@dataclass
class RankMetrics:
    """One rank's time metrics: totals over the counted steps, and each step's own."""

    rank: int
    steps: list[StepMetrics]             # every recorded step
    counted_steps: tuple[int, ...]       # the steps the totals sum (step 0 left out if others)
    wall_s: float = 0.0
    compute_s: float = 0.0
    comm_s: float = 0.0
    overlapped_comm_s: float = 0.0
    exposed_comm_s: float = 0.0
    idle_s: float = 0.0
    overlap_fraction: Optional[float] = None
    bubble_fraction: Optional[float] = None
    pipeline: Optional[PipelineBubble] = None
    theoretical_bubble_fraction: Optional[float] = None
    clock_error_s: Optional[float] = None
    memory_s: float = 0.0
    passes: dict[str, float] = field(default_factory=dict)  # kind -> mean compute s per pass
    phase_s: dict[str, float] = field(default_factory=dict)  # phase -> s over the counted steps


# ---------------------------------------------------------------------------- theory
def theoretical_bubble(schedule: str, p: int, m: int, v: int = 1, *, t_f: float = 1.0,
                       t_b: float = 1.0, t_w: float = 1.0) -> Optional[float]:
    """Bubble fraction of the total time of a pipeline schedule (docs/oracles.md).

    gpipe, 1f1b: (p-1)/(m+p-1). interleaved: bubble/ideal x = (p-1)/(v*m), fraction x/(1+x).
    zb-h1: bubble (p-1)(T_F+T_B-T_W) against ideal m(T_F+T_B+T_W) (pass times default to
    equal). None for an unknown schedule or sizes that make no sense.
    """
    if not isinstance(p, int) or not isinstance(m, int) or p < 1 or m < 1 or v < 1:
        return None
    if p == 1:
        return 0.0
    schedule = (schedule or "").lower()
    if schedule in ("gpipe", "1f1b"):
        return (p - 1) / (m + p - 1)
    if schedule == "interleaved":
        x = (p - 1) / (v * m)
        return x / (1 + x)
    if schedule == "zb-h1":
        bubble, ideal = (p - 1) * max(t_f + t_b - t_w, 0.0), m * (t_f + t_b + t_w)
        return bubble / (bubble + ideal) if bubble + ideal > 0 else None
    return None


def _theory(config: Mapping[str, Any], pass_s: Mapping[str, float]) -> Optional[float]:
    try:
        p, m = int(config.get("pp") or 0), int(config.get("microbatches") or 0)
        v = int(config.get("virtual_stages") or 1)
    except (TypeError, ValueError):
        return None
    times: dict[str, float] = {}
    if "W" in pass_s:
        times = dict(t_f=pass_s.get("F", 0.0), t_b=pass_s.get("B", 0.0), t_w=pass_s["W"])
    return theoretical_bubble(str(config.get("schedule") or ""), p, m, v, **times)


def _step_theory(index: _Index, lane: RankLanes, step: int, run_theory: Optional[float]
                 ) -> Optional[float]:
    """The theory of one step: from the schedule tracer.recorder.frameworks.pipelining recorded on
    the pipeline group in that step (pass times: the group's in the step), else the run's
    config's."""
    ranks = index.timeline.ranks
    found = {ranks[r].schedules[step] for r in lane.pipeline_group
             if r in ranks and step in ranks[r].schedules}
    if not found:
        return run_theory
    only = found.pop() if len(found) == 1 else None        # two schedules, or none: no theory
    if only is None:
        return None
    schedule, p, m, v = only
    config = {"schedule": schedule, "pp": p, "microbatches": m, "virtual_stages": v}
    return _theory(config, _pass_compute(index, {r: (step,) for r in lane.pipeline_group}))


# ---------------------------------------------------------------------------- indexes
class _Index:
    """Per-(rank, step) passes and receives and sends (:class:`_ByStep`), and each rank's
    compute as a prefix sum."""

    def __init__(self, timeline: Timeline) -> None:
        self.timeline = timeline
        self.compute = {rank: Prefix(lane.compute) for rank, lane in timeline.ranks.items()}
        ranks = timeline.ranks
        pass_steps = {rank: lane.passes.column("step") for rank, lane in ranks.items()}
        # (rank, step) -> passes in start order
        self.passes = _ByStep(pass_steps, lambda rank, step: list(
            ranks[rank].passes[pass_steps[rank] == step]))
        comm = {kind: {rank: _spans(lane, kind) for rank, lane in ranks.items()}
                for kind in ("recv", "send")}
        # (rank, step) -> recv (starts, ends), by start
        self.recvs = _ByStep({r: step for r, (step, _, _) in comm["recv"].items()},
                             lambda rank, step: _of_step(comm["recv"][rank], step))
        # (rank, step) -> sorted send starts
        self.sends = _ByStep({r: step for r, (step, _, _) in comm["send"].items()},
                             lambda rank, step: sorted(_of_step(comm["send"][rank], step)[0]))


def _spans(lane: RankLanes, kind: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(step, start, end) arrays of the rank's communication of ``kind``, in start order."""
    at = lane.comm.where("kind", kind)
    return (lane.comm.column("step")[at], lane.comm.column("start")[at],
            lane.comm.column("end")[at])


def _of_step(spans: tuple[np.ndarray, np.ndarray, np.ndarray], step: int
             ) -> tuple[list[int], list[int]]:
    step_of, start, end = spans
    mine = step_of == step
    return start[mine].tolist(), end[mine].tolist()


class _ByStep(Generic[_V]):
    """(rank, step) -> what a rank did in a step, built when asked (``build(rank, step)``):
    a run's passes and P2P times as Python objects, all at once, cost tens of MiB for 64 ranks.
    The entries of the step asked last are kept, so the ranks of a pipeline group, asked in
    turn for one step, build each once. ``steps``: rank -> the step of each of its records."""

    def __init__(self, steps: Mapping[int, np.ndarray], build: Callable[[int, int], _V]) -> None:
        self._keys = {(rank, s) for rank, col in steps.items() for s in np.unique(col).tolist()}
        self._build = build
        self._step: Optional[int] = None
        self._kept: dict[tuple[int, int], _V] = {}

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def get(self, key: tuple[int, int], default: _V) -> _V:
        if key not in self._keys:
            return default
        if key[1] != self._step:
            self._step, self._kept = key[1], {}
        if key not in self._kept:
            self._kept[key] = self._build(*key)
        return self._kept[key]


def _seconds(ns: float) -> float:
    return ns / 1e9


def _ratio(num: float, den: float) -> Optional[float]:
    return num / den if den > 0 else None


# ---------------------------------------------------------------------------- pipeline
def _first_busy(busy: np.ndarray, lo: int, hi: int, default: int) -> int:
    """The first instant of ``busy`` (disjoint, sorted) inside [lo, hi), else ``default``."""
    i = int(np.searchsorted(busy[:, 1], lo, side="right"))    # first interval ending after lo
    if i < len(busy) and max(int(busy[i, 0]), lo) < min(int(busy[i, 1]), hi):
        return max(int(busy[i, 0]), lo)
    return default


def _last_busy(busy: np.ndarray, lo: int, hi: int, default: int) -> int:
    """The end of ``busy`` inside [lo, hi), else ``default``."""
    j = int(np.searchsorted(busy[:, 0], hi, side="left")) - 1  # last interval starting before hi
    if j >= 0 and max(int(busy[j, 0]), lo) < min(int(busy[j, 1]), hi):
        return min(int(busy[j, 1]), hi)
    return default


def _ready(p: Pass, recv_starts: list[int], recv_ends: list[int]) -> int:
    """When the input of pass ``p`` was there: the last completion of the recvs it posted."""
    i, j = bisect.bisect_left(recv_starts, p.start), bisect.bisect_left(recv_starts, p.end)
    return max(recv_ends[i:j], default=p.start)


def _pipeline_bubble(index: _Index, lane: RankLanes, step: int,
                     replayed: Mapping[tuple[int, int], Optional[float]],
                     theory: Optional[float]) -> Optional[PipelineBubble]:
    """Bubble of ``lane`` in the step's pipeline window: from the first pass start to the last
    pass end over its pipeline group (aligned clocks)."""
    mine = index.passes.get((lane.rank, step), [])
    if not mine or len(lane.pipeline_group) < 2:
        return None
    group = [p for r in lane.pipeline_group for p in index.passes.get((r, step), [])]
    lo, hi = min(p.start for p in group), max(p.end for p in group)
    passes = union(intervals([p.start for p in mine], [p.end for p in mine]))
    busy = intersect(window(lane.compute, int(passes[0, 0]), int(passes[-1, 1])), passes)
    # Warm-up lasts until the rank starts computing its first backward, cool-down starts when
    # it stops computing its last forward: waits at the head of a pass belong to the section
    # before it.
    starts, ends = index.recvs.get((lane.rank, step), ([], []))
    first_b = min((_first_busy(busy, _ready(p, starts, ends), p.end, p.start)
                   for p in mine if p.kind != "F"), default=hi)
    last_f = max((_last_busy(busy, p.start, p.end, p.end) for p in mine if p.kind == "F"),
                 default=first_b)
    cool = max(last_f, first_b)
    sections = [(lo, first_b), (first_b, cool), (cool, hi)]
    idle = [max(b - a, 0) - length(window(busy, a, b)) for a, b in sections]
    span = hi - lo
    warmup, steady, cooldown = (_ratio(x, span) for x in idle)
    return PipelineBubble(_seconds(span), _seconds(sum(idle)), _ratio(sum(idle), span),
                          warmup, steady, cooldown,
                          simulated_bubble_fraction=replayed.get((lane.rank, step)),
                          theoretical_bubble_fraction=_step_theory(index, lane, step, theory))


# ---------------------------------------------------------------------------- per step
def _step_metrics(index: _Index, lane: RankLanes, step: int,
                  replayed: Mapping[tuple[int, int], Optional[float]],
                  theory: Optional[float]) -> StepMetrics:
    lo, hi = lane.steps[step]
    compute, comm = window(lane.compute, lo, hi), window(lane.comm_union, lo, hi)
    memory = window(lane.memory, lo, hi)
    overlapped = length(intersect(compute, comm))
    busy = length(compute)
    comm_ns = length(comm)
    wall = hi - lo
    idle = wall - length(union(np.concatenate([compute, comm, memory])))
    return StepMetrics(step, lo, hi, _seconds(wall), _seconds(busy), _seconds(comm_ns),
                       _seconds(overlapped), _seconds(comm_ns - overlapped), _seconds(idle),
                       _ratio(overlapped, comm_ns), _ratio(wall - busy, wall),
                       _pipeline_bubble(index, lane, step, replayed, theory),
                       _seconds(length(memory)), dict(lane.phase_s.get(step, {})))


def _pass_compute(index: _Index, counted: Mapping[int, Collection[int]]) -> dict[str, float]:
    """Mean compute seconds per pass kind over the counted steps of every rank."""
    total: dict[str, tuple[int, float]] = {}       # kind -> (passes, compute ns)
    for rank, lane in index.timeline.ranks.items():
        mine = [p for p in lane.passes if p.step in counted.get(rank, ())]
        if not mine:
            continue
        busy = index.compute[rank].length(np.array([p.start for p in mine]),
                                          np.array([p.end for p in mine]))
        for p, b in zip(mine, busy.tolist()):
            n, s = total.get(p.kind, (0, 0))
            total[p.kind] = (n + 1, s + b)
    return {k: _seconds(s) / n for k, (n, s) in sorted(total.items())}


def _totals(m: RankMetrics, use: list[StepMetrics]) -> None:
    """Fill ``m``'s totals from the counted steps' metrics."""
    for key in ("wall_s", "compute_s", "comm_s", "overlapped_comm_s", "exposed_comm_s",
                "idle_s", "memory_s"):
        setattr(m, key, sum(getattr(s, key) for s in use))
    m.phase_s = {p: sum(s.phase_s.get(p, 0.0) for s in use)
                 for p in dict.fromkeys(p for s in use for p in s.phase_s)}
    m.overlap_fraction = m.overlapped_comm_s / m.comm_s if m.comm_s > 0 else None
    m.bubble_fraction = (m.wall_s - m.compute_s) / m.wall_s if m.wall_s > 0 else None
    pipes = [s.pipeline for s in use if s.pipeline is not None]
    if not pipes:
        return
    span = sum(p.window_s for p in pipes)
    parts = [sum(getattr(p, k) * p.window_s for p in pipes if getattr(p, k) is not None)
             for k in ("warmup_fraction", "steady_fraction", "cooldown_fraction")]
    bubble = sum(p.bubble_s for p in pipes)
    warmup, steady, cooldown = (_ratio(x, span) for x in parts)
    m.pipeline = PipelineBubble(span, bubble, _ratio(bubble, span), warmup, steady, cooldown,
                                _weighted(pipes, "simulated_bubble_fraction"),
                                _weighted(pipes, "theoretical_bubble_fraction"))
    if m.theoretical_bubble_fraction is None and all(
            p.theoretical_bubble_fraction is not None for p in pipes):
        # no run-wide schedule in the config: the steps' own, weighted as the measurement is
        m.theoretical_bubble_fraction = m.pipeline.theoretical_bubble_fraction


def over_steps(m: RankMetrics, steps: frozenset[int]) -> RankMetrics:
    """``m`` with its totals over ``steps`` (those of them it recorded) in place of its counted
    steps: two runs compared over the same steps (trace-diff)."""
    use = [s for s in m.steps if s.step in steps]
    out = replace(m, counted_steps=tuple(s.step for s in use), pipeline=None)
    _totals(out, use)
    return out


def _weighted(pipes: list[PipelineBubble], key: str) -> Optional[float]:
    """The window-weighted mean of ``key`` over the steps that have it."""
    have = [p for p in pipes if getattr(p, key) is not None]
    return _ratio(sum(getattr(p, key) * p.window_s for p in have), sum(p.window_s for p in have))


def metrics_of(timeline: Timeline) -> dict[int, RankMetrics]:
    """rank -> :class:`RankMetrics` of a built timeline."""
    index = _Index(timeline)
    counted = {r: counted_steps(lane) for r, lane in timeline.ranks.items()}
    pass_s = _pass_compute(index, counted)
    theory = _theory(timeline.config, pass_s) if any(
        lane.passes for lane in timeline.ranks.values()) else None
    replayed = replayed_bubbles(timeline, index.passes, index.sends, index.compute)
    # step by step: each pipeline group's passes are built once a step
    by_step: dict[tuple[int, int], StepMetrics] = {}
    for step in sorted({s for lane in timeline.ranks.values() for s in lane.steps}):
        for rank, lane in timeline.ranks.items():
            if step in lane.steps:
                by_step[(rank, step)] = _step_metrics(index, lane, step, replayed, theory)
    out: dict[int, RankMetrics] = {}
    for rank, lane in timeline.ranks.items():
        steps = [by_step[(rank, s)] for s in sorted(lane.steps)]
        m = RankMetrics(rank, steps, tuple(counted[rank]), theoretical_bubble_fraction=theory,
                        passes=pass_s)
        if lane.clock_error_ns is not None:
            m.clock_error_s = _seconds(lane.clock_error_ns)
        _totals(m, [s for s in steps if s.step in counted[rank]])
        out[rank] = m
    return out
