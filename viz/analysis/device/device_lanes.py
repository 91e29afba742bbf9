"""One rank's lanes on the device clock: what the GPU did, where CUPTI says it did it.

:func:`on_device` turns a rank's host lanes (:func:`viz.analysis.timeline.rank_lanes.rank_lanes`)
and its attributed GPU activity (:mod:`viz.analysis.device.gpu_attribution`) into lanes every metric
reads the same way:

- compute: the union of the kernels that are not NCCL's;
- memory: the union of the memcpys and memsets (never compute, never communication: the
  copies a collective issues are memory activity, as in ``device.whole``);
- communication: each collective or P2P op spans the NCCL kernels it launched; one that
  launched none (NCCL on a world of one copies or does nothing; gloo runs on the host) keeps
  its host span for matching across ranks and for drawing, but is not device communication
  (``on_gpu`` False, left out of ``comm_union``);
- passes: each F/B/W pass spans the GPU work its ops launched;
- steps: step s starts when its first GPU work starts (its host boundary when it has none);
- the host's own compute is kept (``host_compute``) for drawing beside the device.

Overlap, exposed communication, idle time and bubbles (:mod:`viz.analysis.timeline.metrics`) then
come out in device time. All times on rank 0's clock.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from ..timeline.columns import Records
from ..timeline.intervals import intervals, union
from ..timeline.lanes import Clock, CommSpan, DeviceLane, Pass, RankLanes, counted_steps
from ..timeline.rank_rows import RankRows
from .gpu_attribution import SETUP, DeviceTime

DRAWN_ACTIVITIES = 100_000      # per rank: GPU activities kept for the Chrome trace


def on_device(lanes: RankLanes, rows: RankRows, dev: DeviceTime,
              budget: int = DRAWN_ACTIVITIES) -> RankLanes:
    """The lanes of ``rows``' rank in device time (see the module docstring); ``budget``:
    GPU activities kept for drawing (whole steps, counted ones first)."""
    offset = rows.trace.clock_offset
    start = dev.start + offset(dev.start)
    end = dev.end + offset(dev.end)
    launch = np.where(dev.launch >= 0, dev.launch + offset(np.maximum(dev.launch, 0)), -1)
    # a trace of no host event (an export of CUDA activity alone) attributes nothing
    attributed = (dev.row >= 0) & (len(rows.t0) > 0)
    at = np.where(attributed, dev.row, 0)
    thread = np.where(attributed, rows.thread[at] if len(rows.t0) else 0, -1)
    row = np.where(attributed, dev.row, len(rows.t0))
    is_comm = dev.is_nccl
    is_memory = dev.is_memory
    spans = _comm_spans(lanes.comm, row[is_comm], start[is_comm], end[is_comm])
    on_gpu = [c for c in spans if c.on_gpu]
    step_of = np.where(attributed, rows.step[at] if len(rows.t0) else 0, 0)
    step_of = np.where(dev.row == SETUP, 0, step_of)
    steps = _step_windows(lanes.steps, step_of, start, end)
    keep = _drawn(step_of, counted_steps(lanes), min(budget, DRAWN_ACTIVITIES))
    return dataclasses.replace(
        lanes, clock=Clock.DEVICE, host_compute=lanes.compute,
        compute=union(intervals(start[~is_comm & ~is_memory], end[~is_comm & ~is_memory])),
        memory=union(intervals(start[is_memory], end[is_memory])),
        comm=Records.of(CommSpan, spans),
        # every NCCL kernel, also one no recorded collective launched
        comm_union=union(np.concatenate([
            intervals([c.start for c in on_gpu], [c.end for c in on_gpu]),
            intervals(start[is_comm], end[is_comm])])),
        passes=_passes(lanes.passes, rows, dev.row, start, end),
        inferred_passes=_passes(lanes.inferred_passes, rows, dev.row, start, end),
        steps=steps,
        device=DeviceLane(start[keep], end[keep], dev.stream[keep], dev.name[keep], dev.names,
                          launch[keep], thread[keep], is_comm[keep],
                          hidden=int(len(start) - keep.sum()), memory=is_memory[keep]))


def _comm_spans(comm: Iterable[CommSpan], row: np.ndarray, start: np.ndarray, end: np.ndarray
                ) -> list[CommSpan]:
    """Each collective over the NCCL kernels it launched (``row``, ``start``, ``end``: theirs);
    one that launched none keeps its host span, marked ``on_gpu`` False."""
    order = np.argsort(row, kind="stable")
    rows, first = np.unique(row[order], return_index=True)
    last = np.append(first[1:], len(order))
    lo = {int(r): int(start[order[a:b]].min()) for r, a, b in zip(rows, first, last)}
    hi = {int(r): int(end[order[a:b]].max()) for r, a, b in zip(rows, first, last)}
    out = []
    for c in comm:
        if c.index in lo:
            c = dataclasses.replace(c, start=lo[c.index], end=hi[c.index], capped=False,
                                    on_gpu=True)
        else:
            c = dataclasses.replace(c, on_gpu=False)
        out.append(c)
    return sorted(out, key=lambda c: c.start)


def _step_windows(host: Mapping[int, tuple[int, int]], step_of: np.ndarray, start: np.ndarray,
                  end: np.ndarray) -> dict[int, tuple[int, int]]:
    """Step s from the start of its first GPU work to the next step's start; the last step to
    the end of its GPU work (host bounds where a step launched nothing)."""
    first = {s: int(start[step_of == s].min()) for s in host if (step_of == s).any()}
    last = {s: int(end[step_of == s].max()) for s in host if (step_of == s).any()}
    keys = sorted(host)
    out = {}
    for i, s in enumerate(keys):
        lo = first.get(s, host[s][0])
        hi = first.get(keys[i + 1], host[keys[i + 1]][0]) if i + 1 < len(keys) \
            else max(last.get(s, host[s][1]), lo)
        if hi > lo:
            out[s] = (lo, hi)
    return out


def _passes(passes: Records[Pass], rows: RankRows, row: np.ndarray, start: np.ndarray,
            end: np.ndarray) -> Records[Pass]:
    """Each pass over the GPU work its ops launched (the ops whose host start lies in it)."""
    if not passes:
        return Records(Pass)
    launched = row >= 0
    host_t = rows.t0[row[launched]]
    order = np.argsort(host_t, kind="stable")
    host_t = host_t[order]
    a, b = start[launched][order], end[launched][order]
    out = []
    for p in passes:
        i, j = np.searchsorted(host_t, [p.start, p.end], side="left")
        if j > i:
            p = Pass(p.rank, p.step, p.kind, p.microbatch, p.chunk, int(a[i:j].min()),
                     int(b[i:j].max()), p.source)
        out.append(p)
    return Records(Pass, sorted(out, key=lambda p: p.start))


def _drawn(step_of: np.ndarray, counted: Sequence[int], budget: int) -> np.ndarray:
    """Which activities to keep for drawing: whole steps, the counted ones first, while they
    fit in ``budget``; the first step's first ``budget`` when not even it fits. A run of many
    ranks shares one budget (viz.analysis), so the report process holds a bounded number."""
    if len(step_of) <= budget:
        return np.ones(len(step_of), bool)
    steps, counts = np.unique(step_of, return_counts=True)
    size = dict(zip(steps.tolist(), counts.tolist()))
    order = [s for s in counted if s in size] + [s for s in size if s not in counted]
    keep, left = [], budget
    for s in order:
        if size[s] <= left:
            keep.append(s)
            left -= size[s]
    drawn = np.isin(step_of, keep)
    if not keep:
        drawn[np.nonzero(step_of == order[0])[0][:budget]] = True
    return drawn
