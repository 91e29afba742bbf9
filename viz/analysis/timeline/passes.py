"""Pipeline passes of one rank: named by annotations or pipelining labels, else inferred.

A pass is one F, B or W pass of one micro-batch through one model chunk
(:class:`viz.analysis.timeline.rank_lanes.Pass`). Annotations (``tracer.annotate("F",
microbatch=...)``) and torch.distributed.pipelining's record_function ranges name them
(:mod:`tracer.vocab.labels`), and so do the ranges :mod:`tracer.recorder.frameworks.pipelining` puts
around its stages' calls, for every schedule; when nothing does, :func:`infer_passes` guesses them
from the order of compute and P2P.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Optional

import numpy as np

from tracer.vocab.labels import (PHASE_BACKWARD, PHASE_FORWARD, PHASE_RECOMPUTE, PassSource,
                                 pass_of, schedule_of)

from .lanes import Annotation, CommSpan, Pass
from .rank_rows import RankRows


def annotation_spans(rows: RankRows) -> tuple[
        list[Pass], list[Annotation], dict[int, Optional[tuple[Any, ...]]]]:
    """(passes, other annotation ranges as (start, end, label, depth), step -> the pipeline
    schedule it ran or None) of one rank's :class:`viz.analysis.timeline.rank_rows.RankRows`.

    Passes named by tracer.recorder.frameworks.pipelining (source "schedule") win over pipelining's
    own record_function labels in the steps that have both; the loss range after a forward extends
    that forward pass. A step that ran two different schedules has none."""
    passes: list[tuple[Pass, bool]] = []       # with whether it ends at a loss
    others: list[Annotation] = []
    schedules: dict[int, Optional[tuple[Any, ...]]] = {}
    trace = rows.trace
    for i in np.nonzero(rows.op == rows.ann_code)[0].tolist():
        stack = trace.annotation(int(rows.annotation[i]))
        if not stack or rows.t1[i] < 0:
            continue
        own = stack[-1]
        label = str(own.get("label", ""))
        start, end, step = int(rows.t0[i]), int(rows.t1[i]), int(rows.step[i])
        found = pass_of(label, own)
        schedule = schedule_of(label, own)
        if found is not None:
            passes.append((Pass(rows.rank, step, found.kind, found.microbatch, found.chunk, start,
                                end, found.source), found.loss))
        elif schedule is not None:
            schedules[step] = schedule if schedules.get(step, schedule) == schedule else None
        else:
            others.append((start, end, label, len(stack) - 1))
    return _merged(passes), sorted(others), schedules


def _merged(found: list[tuple[Pass, bool]]) -> list[Pass]:
    """Passes in start order: record_function passes dropped from steps with schedule passes, a
    loss range merged into the forward pass it follows."""
    by_schedule = {p.step for p, _ in found if p.source == PassSource.SCHEDULE}
    out: list[Pass] = []
    last: dict[tuple[int, str, Optional[int], int], int] = {}   # pass -> its place in out
    for p, loss in sorted(found, key=lambda item: (item[0].start, -item[0].end)):
        if p.source == PassSource.RECORD_FUNCTION and p.step in by_schedule:
            continue
        key = (p.step, p.kind, p.microbatch, p.chunk)
        if loss and key in last:
            i = last[key]
            out[i] = dataclasses.replace(out[i], end=max(out[i].end, p.end))
            continue
        last[key] = len(out)
        out.append(p)
    return out


def infer_passes(rows: RankRows, comm: Sequence[CommSpan]) -> list[Pass]:
    """Passes guessed from the P2P order when nothing names them: a run of forward (backward)
    compute ops is one F (B) pass; a recv starts a new pass and a send ends one. The k-th F (B)
    pass of a step gets micro-batch k. A guess: forward ops outside the pipeline's passes (data,
    a loss or metric computed with grad on) make passes of their own and shift the numbers, and
    interleaved or zero-bubble orders are not recovered (docs/metrics.md).

    Runs of equal (kind, step) are found with numpy; Python only walks the runs."""
    if not any(c.kind in ("send", "recv") and c.peer is not None for c in comm):
        return []             # no pipeline: nothing to infer passes from
    p2p = [i for i, k in enumerate(rows.kinds) if k in ("send", "recv")]
    order = np.nonzero(rows.is_compute | (rows.is_comm & np.isin(rows.kind, p2p)
                                          & (rows.peer >= 0)))[0]
    ends = np.where(rows.is_comm, rows.t_ret, rows.t1)
    order = order[np.lexsort((ends[order], rows.t0[order]))]
    phase = rows.trace.col("phase")[order]
    # pass kind per event: 0 none (a P2P op or another phase: closes the pass), 1 F, 2 B
    # (checkpointing's recomputation runs inside the backward pass: part of it)
    backward = (phase == PHASE_BACKWARD) | (phase == PHASE_RECOMPUTE)
    kind = np.where(rows.is_comm[order], 0, np.where(phase == PHASE_FORWARD, 1,
                                                     np.where(backward, 2, 0)))
    step = rows.step[order]
    change = np.ones(len(order), bool)
    change[1:] = (kind[1:] != kind[:-1]) | (step[1:] != step[:-1]) | (kind[1:] == 0)
    starts = np.nonzero(change)[0]
    stops = np.append(starts[1:], len(order)) - 1
    passes: list[Pass] = []
    counts: dict[tuple[int, str], int] = {}
    t0, t1 = rows.t0[order], rows.t1[order]
    for a, b in zip(starts.tolist(), stops.tolist()):
        if kind[a] == 0:
            continue
        name = "F" if kind[a] == 1 else "B"
        s = int(step[a])
        k = counts.get((s, name), 0)
        counts[(s, name)] = k + 1
        passes.append(Pass(rows.rank, s, name, k, 0, int(t0[a]), int(t1[b]),
                           PassSource.INFERRED))
    return passes
