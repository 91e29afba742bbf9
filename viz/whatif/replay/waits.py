"""When a rank had each communication's result, and where it waited for it, in traces whose
completions may have come late.

The timeline takes a collective's completion from the trace and counts the host time between a
thread's ops as compute unless a completion falls inside it (docs/metrics.md). Traces recorded
before the recorder stamped completions where they happen (no ``completion`` key in their
metadata, docs/trace-format.md) took it from the work's future callback (or the end of
``Work.wait()`` where the work has no future), and with gloo the callback waits for the GIL, so
it can land milliseconds after the waiting thread went on:

- a blocking collective returns from its dispatch at once and then waits for its work: the
  rank had the result when it resumed, at its next op, if that came before the callback;
- an asynchronous one (``async_op=True``) is waited for later, in ``Work.wait()``: if its
  callback came late, the wait is the longest gap between the rank's ops after the launch
  returned and before the callback that holds no other completion, when that gap is far longer
  than the rank's usual host time between ops (:data:`WAIT_FACTOR` times its median, and at
  least :data:`MIN_WAIT_NS`).

Either wait is not compute. Needs the rank's ops (all of them kept for drawing); without them
the recorded completions stand. Traces with the key are read as they are
(:func:`late_completions`): their completion is never after the end of the wait that saw it,
so no wait can hide in host time, and the gaps the rules above would pick there are not waits
(after an asynchronous launch, the rank goes on with its backward: on the reference GPT with
dp 2, ~140 gaps a rank per run, 6 steps, 37 to 280 ms, the main thread descheduled while the
gloo threads reduce, none of them in a ``Work.wait()``).
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from tracer.vocab.ops import P2P_KINDS

from ...analysis.timeline.intervals import gaps, intersect, intervals, union

WAIT_FACTOR = 4
MIN_WAIT_NS = 50_000


def late_completions(meta: dict) -> bool:
    """Whether a trace's recorded completions may lie after the rank had the result: a
    paratrace trace without the ``completion`` key
    (tracer.recorder.process.process_info.COMPLETION). Traces imported from torch.profiler exports
    (``imported``) have neither launch returns nor async flags, so the rules have nothing to read
    there either."""
    return "completion" not in meta and "imported" not in meta


class RankView(NamedTuple):
    """A rank's compute lane without its waits, and when it had each communication's result
    (trace row -> ns)."""

    compute: np.ndarray
    done: dict


def hidden_waits(lane) -> dict:
    """trace row -> (start, end) of each wait the timeline counted as compute (the module
    docstring); a caller keeps those that end after every member launched the collective."""
    out: dict = {}
    if lane.hidden_ops or not len(lane.op_start):
        return out
    order = np.argsort(lane.op_start, kind="stable")
    starts, ends = lane.op_start[order], np.maximum.accumulate(lane.op_end[order])
    between = starts[1:] - ends[:-1]               # host time after op i, before op i+1
    usual = float(np.median(between[between > 0])) if (between > 0).any() else 0.0
    least = max(WAIT_FACTOR * usual, MIN_WAIT_NS)
    # a gap that holds a completion is already a wait the timeline sees: not a hidden one
    completions = np.sort(np.array([s.end for s in lane.comm if s.completed], np.int64))
    holds = np.searchsorted(completions, starts[1:], side="left") > \
        np.searchsorted(completions, ends[:-1], side="right")
    between = np.where(holds, 0, between)
    for s in lane.comm:
        if s.blocking is None or s.returned is None or not s.completed or \
                s.kind in P2P_KINDS:
            continue
        i = int(np.searchsorted(starts, s.returned, side="left"))
        if s.blocking:
            if i < len(starts) and starts[i] < s.end:
                out[s.index] = (s.returned, int(starts[i]))
            continue
        j = int(np.searchsorted(starts, s.end, side="left"))     # ops begun before the callback
        if j - i < 1 or i < 1:
            continue
        gap = i - 1 + int(np.argmax(between[i - 1:j - 1]))      # after op gap, before op gap+1
        if between[gap] >= least and starts[gap + 1] < s.end:
            out[s.index] = (max(int(ends[gap]), s.returned), int(starts[gap + 1]))
    return out


def rank_view(lane, waits: dict) -> RankView:
    """The RankView of one rank's lanes (viz.analysis.timeline.lanes.RankLanes) with ``waits`` (trace row ->
    (start, end), from :func:`hidden_waits`) taken out of its compute."""
    done = {s.index: s.end for s in lane.comm}
    for index, (_, end) in waits.items():
        done[index] = end
    compute = lane.compute
    if waits:
        spans = list(waits.values())
        compute = _minus(compute, union(intervals([a for a, _ in spans], [b for _, b in spans])))
    return RankView(compute, done)


def _minus(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Interval set ``a`` without ``b`` (both disjoint and sorted)."""
    if not len(a) or not len(b):
        return a
    lo, hi = min(int(a[0, 0]), int(b[0, 0])), max(int(a[-1, 1]), int(b[-1, 1]))
    return intersect(a, gaps(b, lo, hi))
