"""One rank's lanes on rank 0's clock: its compute, communication, passes and steps, built from
its trace alone (the map; :mod:`.assemble` puts every rank's lanes together).

Built in two per-rank phases around one cross-rank step, so that each rank's trace can be
analysed on its own (in a worker process, one trace in memory at a time):

1. :func:`p2p_endpoints` lists one rank's sends and receives (small);
2. :func:`.assemble.match_p2p` pairs them across ranks and says where each send really ended;
3. :func:`rank_lanes` builds one rank's :class:`~.lanes.RankLanes` given those send ends.

:mod:`..map_reduce` runs them, rank by rank. Definitions and worked examples are in
docs/metrics.md. All times are integer nanoseconds on rank 0's clock (``Trace.global_times``).
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Optional, Union

import numpy as np

from tracer.vocab.groups import group_ranks
from tracer.vocab.labels import PHASES
from tracer.vocab.ops import P2P_KINDS

from ..callgraphs.op_groups import Frame, site_of

from .columns import Records
from .intervals import intervals, union
from .lanes import CommSpan, P2PEnd, Pass, RankLanes
from .passes import annotation_spans, infer_passes
from .phase_time import phase_seconds, phase_spans
from .rank_rows import RankRows

# A gap between two ops of one thread longer than this is idle, not host overhead: Python,
# autograd and the tracer take microseconds to a few ms between ops, even on a loaded machine.
IDLE_GAP_NS = 50_000_000
# Individual ops kept for drawing (the Chrome trace), over all ranks: whole steps, counted
# steps first, until the budget is spent. Every measure uses all ops; the trace keeps them all.
DRAWN_OPS = 400_000


def p2p_endpoints(rows: RankRows) -> list[P2PEnd]:
    """The rank's sends and receives with a known peer, in launch order."""
    out = []
    comm = np.nonzero(rows.is_comm)[0]
    for i in comm[np.argsort(rows.t0[comm], kind="stable")].tolist():
        kind = rows.kinds[rows.kind[i]]
        peer = int(rows.peer[i])
        if kind not in P2P_KINDS or peer < 0:
            continue
        src, dst = (rows.rank, peer) if kind == "send" else (peer, rows.rank)
        out.append(P2PEnd(rows.group_of(i), src, dst, kind == "recv", i, int(rows.t1[i])))
    return out


def rank_lanes(rows: RankRows, send_ends: Mapping[int, int], op_budget: int = DRAWN_OPS
               ) -> RankLanes:
    """One rank's lanes; ``send_ends``: send row -> its matched receive's completion;
    ``op_budget``: individual ops kept for drawing."""
    comm = _comm_spans(rows, send_ends)
    steps, closed = _step_windows(rows)
    passes, others, schedules = annotation_spans(rows)
    group = {rows.rank}
    for c in comm:
        if c.kind in P2P_KINDS and c.group and not c.group.startswith("?"):
            group.update(group_ranks(c.group))
    drawn = _drawn_ops(rows, steps, closed, op_budget)
    phases = phase_spans(rows, comm, IDLE_GAP_NS)
    op_args, op_arg_texts = _op_args(rows, drawn)
    return RankLanes(
        rank=rows.rank, compute=_compute_spans(rows, comm), comm=Records.of(CommSpan, comm),
        comm_union=union(intervals([c.start for c in comm], [c.end for c in comm])),
        passes=Records.of(Pass, passes), steps=steps, closed_steps=closed,
        op_start=rows.t0[drawn],
        op_end=rows.t1[drawn], op_name=rows.op[drawn], op_thread=rows.thread[drawn],
        op_names=rows.op_names, hidden_ops=int(rows.is_compute.sum() - drawn.sum()),
        annotations=others, schedules=schedules, pipeline_group=tuple(sorted(group)),
        clock_error_ns=rows.trace.clock_error_ns,
        inferred_passes=Records.of(Pass, [] if passes else infer_passes(rows, comm)),
        recorded_until=int(max(rows.t0.max(initial=0), rows.t1.max(initial=0))),
        closed=rows.trace.status != "running", stopped=rows.trace.status != "ok",
        phase_s={s: phase_seconds(phases, lo, hi) for s, (lo, hi) in steps.items()},
        op_args=op_args, op_arg_texts=op_arg_texts)


def _drawn_ops(rows: RankRows, steps: Mapping[int, tuple[int, int]], closed: frozenset[int],
               budget: int) -> np.ndarray:
    """Which compute ops to keep for drawing: whole steps, the counted ones first (in order),
    then the others, while they fit in ``budget``; a first step too big is cut at the budget."""
    sel = rows.is_compute
    if sel.sum() <= budget:
        return sel
    counts: Union[np.ndarray, list[int]] = \
        np.bincount(rows.step[sel] - rows.step[sel].min()) if sel.any() else []
    first = int(rows.step[sel].min()) if sel.any() else 0
    counted = [s for s in sorted(steps) if s in closed and s != 0]
    order = counted + [s for s in sorted(set(rows.step[sel].tolist())) if s not in counted]
    keep, left = [], budget
    for s in order:
        n = int(counts[s - first]) if 0 <= s - first < len(counts) else 0
        if n <= left:
            keep.append(s)
            left -= n
    drawn = sel & np.isin(rows.step, keep)
    if not keep and order:             # not even one step fits: its first ``budget`` ops
        drawn = sel & (rows.step == order[0])
        drawn[np.nonzero(drawn)[0][budget:]] = False
    return drawn


def _op_args(rows: RankRows, drawn: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """(a code per drawn op, the JSON texts they index): each op's module, phase, source line
    (the innermost user frame; a backward op's forward's) and input shapes, and its step, as
    the Chrome trace's ``args``; a combination many ops share is made into text once."""
    trace = rows.trace
    at = np.nonzero(drawn)[0]
    if not len(at):
        return np.zeros(0, dtype=np.int32), []
    cols = np.stack([trace.col(c)[at].astype(np.int64) for c in
                     ("module", "phase", "stack", "fwd_stack", "shapes", "step")], axis=1)
    keys, inverse = np.unique(cols, axis=0, return_inverse=True)
    modules, shapes = trace.dictionary("module"), trace.dictionary("shapes")
    texts = []
    for module, phase, stack, fwd, shape, step in keys.tolist():
        frame = site_of(trace, stack, fwd)
        texts.append(json.dumps({
            "module": modules[module] if module >= 0 else None,
            "phase": PHASES[phase] if 0 <= phase < len(PHASES) else None,
            "source": f"{frame.file}:{frame.line}" if frame is not None else None,
            "function": frame.qualname if frame is not None else None,
            "shapes": shapes[shape] if shape >= 0 else None, "step": step},
            separators=(",", ":")))
    return inverse.reshape(-1).astype(np.int32), texts


def _step_windows(rows: RankRows) -> tuple[dict[int, tuple[int, int]], frozenset[int]]:
    """(step -> (start, end), closed steps): a step runs from its paratrace::step marker (or
    first event) to the next step's start (or its last event); it is closed when the next
    step's marker ends it."""
    if not len(rows.t0):
        return {}, frozenset()
    is_marker = rows.op == rows.step_code
    markers = {int(s): int(t) for s, t in zip(rows.step[is_marker], rows.t0[is_marker])}
    real = rows.real | (rows.op == rows.ann_code) | is_marker
    ends = np.where(rows.t1 >= 0, rows.t1, rows.t0)
    steps = rows.step[real]
    order = np.argsort(steps, kind="stable")
    keys, first = np.unique(steps[order], return_index=True)
    starts: Union[np.ndarray, list[int]] = \
        np.minimum.reduceat(rows.t0[real][order], first) if len(keys) else []
    stops: Union[np.ndarray, list[int]] = \
        np.maximum.reduceat(ends[real][order], first) if len(keys) else []
    windows = {int(s): [markers.get(int(s), int(a)), int(b)]
               for s, a, b in zip(keys, starts, stops)}
    closed = frozenset(s for s in windows if s + 1 in markers)
    for s in windows:
        if s + 1 in windows:
            windows[s][1] = windows[s + 1][0]
    return {s: (a, b) for s, (a, b) in sorted(windows.items()) if b > a}, closed


def _compute_spans(rows: RankRows, comm: Sequence[CommSpan]) -> np.ndarray:
    """Compute ops, plus the host time between a thread's consecutive ops (Python, autograd,
    tracer overhead, preemption), except the part of a gap before a communication completed
    in it (there the thread was, as far as the trace can tell, waiting for that completion)
    and gaps longer than IDLE_GAP_NS (no host overhead is that long: the rank was idle)."""
    done = np.sort(np.array([c.end for c in comm if c.completed], dtype=np.int64))
    spans = [intervals(rows.t0[rows.is_compute], rows.t1[rows.is_compute])]
    for thread in np.unique(rows.thread[rows.real]).tolist():
        sel = np.nonzero(rows.real & (rows.thread == thread))[0]
        sel = sel[np.argsort(rows.t0[sel], kind="stable")]
        start = rows.t0[sel]
        end = np.where(rows.t1[sel] >= 0, rows.t1[sel], rows.t0[sel])
        end = np.where(rows.is_comm[sel] & (rows.t_ret[sel] >= 0), rows.t_ret[sel], end)
        reach = np.maximum.accumulate(end)[:-1]
        nxt = start[1:]
        has_gap = nxt > reach
        a, b = reach[has_gap], nxt[has_gap]
        if len(done):
            i = np.searchsorted(done, b, side="right") - 1
            last_done = np.where(i >= 0, done[np.maximum(i, 0)], np.iinfo(np.int64).min)
            a = np.where(last_done > a, last_done, a)
        short = b - a <= IDLE_GAP_NS
        spans.append(intervals(a[short], b[short]))
    return union(np.concatenate(spans))


def _comm_spans(rows: RankRows, send_ends: Mapping[int, int]) -> list[CommSpan]:
    last = int(max(rows.t1.max(initial=0), rows.t0.max(initial=0), rows.t_ret.max(initial=0)))
    trace = rows.trace
    nbytes, seq, dtype = trace.col("bytes"), trace.col("seq"), trace.col("dtype")
    async_op = trace.col("async_op")
    stack, fwd_stack = trace.col("stack"), trace.col("fwd_stack")
    dtypes = trace.dictionary("dtype")
    sites: dict[tuple[int, int], Optional[Frame]] = {}
    spans = []
    for i in np.nonzero(rows.is_comm)[0].tolist():
        start, end = int(rows.t0[i]), int(rows.t1[i])
        completed = end >= 0
        end = end if completed else last
        capped = False
        limit = send_ends.get(i)
        if limit is not None and 0 <= limit < end:
            # NOTE: a deferred send is only seen complete when waited (gloo's P2P works have no
            # future); its data had arrived once the matching recv completed on the peer.
            end, capped = max(int(limit), int(max(rows.t_ret[i], start))), True
        peer = int(rows.peer[i])
        key = (int(stack[i]), int(fwd_stack[i]))
        if key not in sites:
            sites[key] = site_of(trace, *key)
        spans.append(CommSpan(rows.rank, i, rows.kinds[rows.kind[i]], int(rows.step[i]), start,
                              end, peer if peer >= 0 else None, rows.group_of(i),
                              max(int(nbytes[i]), 0), completed, capped,
                              int(seq[i]) if seq[i] >= 0 else None,
                              dtypes[dtype[i]] if dtype[i] >= 0 else None, sites[key],
                              int(rows.t_ret[i]) if rows.t_ret[i] >= 0 else None,
                              bool(async_op[i] == 0) if async_op[i] >= 0 else None))
    return sorted(spans, key=lambda c: c.start)
