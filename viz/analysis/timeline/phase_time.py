"""Time per phase: how a rank's step splits into forward, backward, recompute, grad_sync,
optimizer and other, from the phase every op carries (docs/phases.md), for any run, annotated
or not. Definitions and a worked example: docs/metrics.md, "Time per phase".

The rank's real ops (every thread; no pseudo-op) are taken in start order, on the host clock:

- an op owns its time from its start to the next op's start, or to its end (for a collective:
  when its call returned) if that comes first, and nothing it started later than it still runs:
  so nested and overlapping ops split their time, never count it twice;
- a gap before the next op is host work leading to it (Python, the autograd engine): the next
  op's phase; but where a communication completed in the gap, the part of it before the
  completion was the wait for it: that communication's phase (as the compute lane counts it,
  docs/metrics.md);
- a gap longer than :data:`.rank_lanes.IDLE_GAP_NS` is idle, no phase's.

So a step's phases sum to its wall time less its idle gaps and the time before its first op.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from tracer.vocab.labels import PHASES

from .lanes import CommSpan
from .rank_rows import RankRows

OTHER = PHASES.index("other")


def phase_spans(rows: RankRows, comm: Sequence[CommSpan], idle_gap_ns: int) -> np.ndarray:
    """(n, 3) int64 rows of (start, end, phase index into PHASES) covering the rank's time as
    the module docstring says, in time order; ``rows`` a :class:`.rank_rows.RankRows`,
    ``comm`` its CommSpans."""
    sel = np.nonzero(rows.real & (rows.t0 >= 0))[0]
    if not len(sel):
        return np.zeros((0, 3), dtype=np.int64)
    sel = sel[np.argsort(rows.t0[sel], kind="stable")]
    start = rows.t0[sel]
    end = np.where(rows.t1[sel] >= 0, rows.t1[sel], start)
    end = np.where(rows.is_comm[sel] & (rows.t_ret[sel] >= 0), rows.t_ret[sel], end)
    phase = _phases(rows.trace.col("phase")[sel])
    reach = np.maximum(np.maximum.accumulate(end), start)
    nxt = np.append(start[1:], reach[-1])
    owned = np.minimum(reach, nxt)
    parts = [np.stack([start, owned, phase], axis=1)]
    gap = np.nonzero(nxt[:-1] > owned[:-1])[0]
    a, b, after = owned[gap], nxt[gap], phase[gap + 1]
    short = b - a <= idle_gap_ns
    a, b, after = a[short], b[short], after[short]
    done, done_phase = _completions(rows, comm)
    if len(done) and len(a):
        i = np.searchsorted(done, b, side="right") - 1
        waited = (i >= 0) & (done[np.maximum(i, 0)] > a)
        c = done[np.maximum(i, 0)]
        parts.append(np.stack([a[waited], c[waited], done_phase[np.maximum(i, 0)][waited]],
                              axis=1))
        a = np.where(waited, c, a)
    parts.append(np.stack([a, b, after], axis=1))
    out = np.concatenate(parts).astype(np.int64)
    out = out[out[:, 1] > out[:, 0]]
    return out[np.argsort(out[:, 0], kind="stable")]


def _phases(codes: np.ndarray) -> np.ndarray:
    codes = np.asarray(codes, dtype=np.int64)
    return np.where((codes >= 0) & (codes < len(PHASES)), codes, OTHER)


def _completions(rows: RankRows, comm: Sequence[CommSpan]) -> tuple[np.ndarray, np.ndarray]:
    """(sorted completion times, their phases) of the communications that completed."""
    phase = rows.trace.col("phase")
    done = [(c.end, c.index) for c in comm if c.completed]
    if not done:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    done.sort()
    times = np.array([t for t, _ in done], dtype=np.int64)
    return times, _phases(np.array([phase[i] for _, i in done]))


def phase_seconds(spans: np.ndarray, lo: int, hi: int) -> dict[str, float]:
    """phase -> seconds of ``spans`` (:func:`phase_spans`) inside [lo, hi), every phase."""
    if not len(spans):
        return dict.fromkeys(PHASES, 0.0)
    first = max(int(np.searchsorted(spans[:, 0], lo, side="right")) - 1, 0)
    last = int(np.searchsorted(spans[:, 0], hi, side="left"))
    part = spans[first:last]
    length = np.clip(np.minimum(part[:, 1], hi) - np.maximum(part[:, 0], lo), 0, None)
    ns = np.bincount(part[:, 2], weights=length, minlength=len(PHASES))
    return {name: float(ns[i]) / 1e9 for i, name in enumerate(PHASES)}
