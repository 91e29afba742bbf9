"""Per-rank timeline analysis: when each rank computed, communicated, waited, and its bubbles.

Pure analyses of a loaded :class:`viz.trace.Run` (definitions and worked examples in
docs/metrics.md):

- :func:`build_timeline` lays every rank on rank 0's clock: compute spans, communication spans
  (a collective's launch to completion), F/B/W passes per micro-batch, step windows, and the
  send -> recv pairs of pipeline messages;
- :func:`run_metrics` turns that into per-rank, per-step time metrics (compute, comm, exposed
  comm, idle, overlap fraction, bubble fraction, the pipeline bubble split into warm-up, steady
  state and cool-down) beside the theoretical bubble of the recorded schedule;
- :func:`theoretical_bubble` is the papers' bubble fraction (shared/ORACLES.md);
- :func:`write_timeline` renders the SVG and the Chrome trace (viz/render/).

All times are integer nanoseconds on rank 0's clock (``Trace.global_times``).
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from typing import Optional

import numpy as np

from tracer import ops as _ops
from tracer.labels import pass_of

from .trace import Run

# A gap between two ops of one thread longer than this is idle, not host overhead: Python,
# autograd and the tracer take microseconds to a few ms between ops, even on a loaded machine.
IDLE_GAP_NS = 50_000_000
_WAIT_OPS = ("_c10d_functional.wait_tensor.default", "c10d_functional.wait_tensor.default")


# ---------------------------------------------------------------------------- records
@dataclass(frozen=True)
class Pass:
    """One F, B or W pass of one micro-batch through one model chunk on one rank."""

    rank: int
    step: int
    kind: str                  # "F" | "B" | "W"
    microbatch: Optional[int]
    chunk: int
    start: int
    end: int
    source: str                # "annotation" | "record_function" | "inferred"


@dataclass(frozen=True)
class CommSpan:
    """One collective or P2P operation: launch to (effective) completion."""

    rank: int
    index: int                 # row in the rank's trace
    kind: str
    step: int
    start: int
    end: int
    peer: Optional[int]
    group: str
    nbytes: int
    completed: bool            # False: never completed; ``end`` is the end of the recording
    capped: bool = False       # a send whose end was moved to its matched recv's completion


@dataclass(frozen=True)
class P2PLink:
    """A send matched with the receive that consumed it (for flows and send completion)."""

    src: int
    src_index: int             # CommSpan.index on the sender
    dst: int
    dst_index: int


@dataclass
class RankLanes:
    """Everything drawn and measured for one rank. Interval arrays are (n, 2) int64, disjoint."""

    rank: int
    compute: np.ndarray        # busy computing: aten ops plus host time between them
    comm: list                 # CommSpan, in launch order
    comm_union: np.ndarray
    passes: list               # Pass, in start order
    steps: dict                # step -> (start, end), steps with a non-empty window
    closed_steps: frozenset    # steps whose end is the next step's boundary marker
    op_start: np.ndarray       # individual compute ops (for the Chrome trace)
    op_end: np.ndarray
    op_name: np.ndarray        # codes into op_names
    op_thread: np.ndarray
    op_names: list
    annotations: list          # (start, end, label, depth) of non-pass annotations
    pipeline_group: tuple      # ranks this rank exchanges pipeline messages with (itself too)
    clock_error_ns: Optional[int]


@dataclass
class Timeline:
    """Every rank's lanes on one clock."""

    ranks: dict                # rank -> RankLanes
    links: list                # P2PLink
    config: dict
    origin: int                # earliest time of any counted step (drawing origin)


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

    def to_json(self) -> dict:
        out = asdict(self)
        out["start_ns"], out["end_ns"] = out.pop("start"), out.pop("end")
        return out


@dataclass
class RankMetrics:
    """One rank's time metrics: totals over the counted steps, and each step's own."""

    rank: int
    steps: list                          # StepMetrics, every recorded step
    counted_steps: tuple                 # the steps the totals sum (step 0 left out if others)
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
    passes: dict = field(default_factory=dict)   # kind -> mean compute seconds per pass

    def to_json(self) -> dict:
        """summary.json's ``time`` object: DESIGN.md's keys first, then the details."""
        return {
            "wall_s": self.wall_s, "compute_s": self.compute_s, "comm_s": self.comm_s,
            "exposed_comm_s": self.exposed_comm_s, "idle_s": self.idle_s,
            "overlap_fraction": self.overlap_fraction, "bubble_fraction": self.bubble_fraction,
            "overlapped_comm_s": self.overlapped_comm_s,
            "counted_steps": list(self.counted_steps),
            "pipeline": asdict(self.pipeline) if self.pipeline else None,
            "theoretical_bubble_fraction": self.theoretical_bubble_fraction,
            "pass_compute_s": self.passes,
            "clock_error_s": self.clock_error_s,
            "per_step": [s.to_json() for s in self.steps],
        }


# ---------------------------------------------------------------------------- intervals
# Interval sets are (n, 2) int64 arrays of disjoint [start, end) sorted by start. numpy keeps
# these linear-time on traces of millions of events, where interval objects would not.
_EMPTY = np.zeros((0, 2), dtype=np.int64)


def _intervals(starts, ends) -> np.ndarray:
    iv = np.stack([np.asarray(starts, np.int64), np.asarray(ends, np.int64)], axis=1) \
        if len(starts) else _EMPTY
    return iv[iv[:, 1] > iv[:, 0]]


def union(iv: np.ndarray) -> np.ndarray:
    """Merge overlapping or touching intervals."""
    if len(iv) == 0:
        return _EMPTY
    iv = iv[np.argsort(iv[:, 0], kind="stable")]
    reach = np.maximum.accumulate(iv[:, 1])
    new = np.ones(len(iv), bool)
    new[1:] = iv[1:, 0] > reach[:-1]
    first = np.nonzero(new)[0]
    last = np.append(first[1:] - 1, len(iv) - 1)
    return np.stack([iv[first, 0], reach[last]], axis=1)


def intersect(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Intersection of two disjoint interval sets."""
    if len(a) == 0 or len(b) == 0:
        return _EMPTY
    pos = np.concatenate([a[:, 0], a[:, 1], b[:, 0], b[:, 1]])
    delta = np.concatenate([np.ones(len(a)), -np.ones(len(a)), np.ones(len(b)),
                            -np.ones(len(b))]).astype(np.int64)
    order = np.lexsort((delta, pos))       # ends before starts at one position
    pos, depth = pos[order], np.cumsum(delta[order])
    both = np.nonzero(depth[:-1] == 2)[0]
    return _intervals(pos[both], pos[both + 1])


def clip(iv: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """The parts of ``iv`` inside [lo, hi)."""
    return _intervals(np.clip(iv[:, 0], lo, hi), np.clip(iv[:, 1], lo, hi)) if len(iv) else _EMPTY


def gaps(iv: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """The parts of [lo, hi) that ``iv`` (disjoint) does not cover."""
    iv = clip(iv, lo, hi)
    return _intervals(np.concatenate([[lo], iv[:, 1]]), np.concatenate([iv[:, 0], [hi]]))


def length(iv: np.ndarray) -> int:
    return int((iv[:, 1] - iv[:, 0]).sum()) if len(iv) else 0


# ---------------------------------------------------------------------------- theory
def theoretical_bubble(schedule: str, p: int, m: int, v: int = 1, *, t_f: float = 1.0,
                       t_b: float = 1.0, t_w: float = 1.0) -> Optional[float]:
    """Bubble fraction of the total time of a pipeline schedule (shared/ORACLES.md).

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


# ---------------------------------------------------------------------------- building
def build_timeline(run: Run) -> Timeline:
    """Lay every readable rank of ``run`` on rank 0's clock (see docs/metrics.md)."""
    raw = {rank: _RankRows(trace, rank) for rank, trace in sorted(run.ranks.items())}
    links = _match_p2p(raw)
    cap = {}
    for link in links:
        recv = raw[link.dst]
        cap[(link.src, link.src_index)] = recv.t1[link.dst_index]
    lanes = {rank: _lanes(rows, cap) for rank, rows in raw.items()}
    if not any(lane.passes for lane in lanes.values()):
        for lane in lanes.values():
            lane.passes = _infer_passes(raw[lane.rank], lane)
    counted = [w for lane in lanes.values() for s, w in lane.steps.items()
               if s in _counted(lane)]
    origin = min((w[0] for w in counted), default=0)
    return Timeline(lanes, links, run.config, origin)


class _RankRows:
    """One trace's columns on the global clock, and which rows are what."""

    def __init__(self, trace, rank: int):
        self.trace = trace
        self.rank = rank          # the run's key (the file's rank), whatever the metadata says
        self.t0, self.t1 = trace.global_times()
        t_ret = trace.col("t_ret")
        self.t_ret = np.where(t_ret >= 0, t_ret + trace.clock_offset(np.maximum(t_ret, 0)), -1)
        self.op = trace.col("op")
        self.kind = trace.col("kind")
        self.step = trace.col("step")
        self.thread = trace.col("thread")
        self.annotation = trace.col("annotation")
        names = trace.dictionary("op")
        self.op_names = names
        code = {name: i for i, name in enumerate(names)}
        self.ann_code = code.get(_ops.OP_ANNOTATION, -2)
        self.step_code = code.get(_ops.OP_STEP, -2)
        pseudo = [code[n] for n in _ops.PSEUDO_OPS if n in code]
        waits = [code[n] for n in _WAIT_OPS if n in code]
        self.real = ~np.isin(self.op, pseudo)
        self.is_comm = self.kind >= 0
        self.is_compute = self.real & ~self.is_comm & ~np.isin(self.op, waits) & (self.t1 >= 0)
        self.kinds = trace.dictionary("kind")
        self.groups = trace.dictionary("group")


def _step_windows(rows: _RankRows):
    """(step -> (start, end), closed steps): a step runs from its paratrace::step marker (or
    first event) to the next step's start (or its last event); it is closed when the next
    step's marker ends it."""
    if not len(rows.t0):
        return {}, frozenset()
    markers = {int(s): int(t) for s, t in zip(rows.step[rows.op == rows.step_code],
                                              rows.t0[rows.op == rows.step_code])}
    windows = {}
    real = rows.real | (rows.op == rows.ann_code) | (rows.op == rows.step_code)
    ends = np.where(rows.t1 >= 0, rows.t1, rows.t0)
    for s in np.unique(rows.step).tolist():
        mine = (rows.step == s) & real
        if not mine.any():
            continue
        start = markers.get(s, int(rows.t0[mine].min()))
        windows[s] = [start, int(ends[mine].max())]
    closed = frozenset(s for s in windows if s + 1 in markers)
    for s in windows:
        if s + 1 in windows:
            windows[s][1] = windows[s + 1][0]
    return {s: (a, b) for s, (a, b) in sorted(windows.items()) if b > a}, closed


def _counted(lane: "RankLanes") -> list:
    """Steps the totals sum: the complete ones (closed by the next step's boundary) except step
    0, which runs from the start of the recording and carries one-off setup (model
    construction, allocator warm-up). With none such, every step counts."""
    keys = sorted(lane.steps)
    return [s for s in keys if s in lane.closed_steps and s != 0] or keys


def _compute_spans(rows: _RankRows, comm: list) -> np.ndarray:
    """Compute ops, plus the host time between a thread's consecutive ops (Python, autograd,
    tracer overhead, preemption), except the part of a gap before a communication completed
    in it (there the thread was, as far as the trace can tell, waiting for that completion)
    and gaps longer than IDLE_GAP_NS (no host overhead is that long: the rank was idle)."""
    done = np.sort(np.array([c.end for c in comm if c.completed], dtype=np.int64))
    spans = [_intervals(rows.t0[rows.is_compute], rows.t1[rows.is_compute])]
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
        spans.append(_intervals(a[short], b[short]))
    return union(np.concatenate(spans))


def _comm_spans(rows: _RankRows, cap: dict) -> list:
    last = int(max(rows.t1.max(initial=0), rows.t0.max(initial=0), rows.t_ret.max(initial=0)))
    spans = []
    for i in np.nonzero(rows.is_comm)[0].tolist():
        start, end = int(rows.t0[i]), int(rows.t1[i])
        completed = end >= 0
        end = end if completed else last
        capped = False
        limit = cap.get((rows.rank, i))
        if limit is not None and 0 <= limit < end:
            # NOTE: a deferred send is only seen complete when waited (gloo's P2P works have no
            # future); its data had arrived once the matching recv completed on the peer.
            end, capped = max(int(limit), int(max(rows.t_ret[i], start))), True
        peer = int(rows.trace.col("peer")[i])
        spans.append(CommSpan(rows.rank, i, rows.kinds[rows.kind[i]], int(rows.step[i]), start,
                              end, peer if peer >= 0 else None,
                              rows.groups[rows.trace.col("group")[i]]
                              if rows.trace.col("group")[i] >= 0 else "",
                              max(int(rows.trace.col("bytes")[i]), 0), completed, capped))
    return sorted(spans, key=lambda c: c.start)


def _match_p2p(raw: dict) -> list:
    """Pair the k-th send from a to b on a group with the k-th recv on b from a."""
    queues: dict = {}
    for rank, rows in raw.items():
        for i in np.nonzero(rows.is_comm)[0][np.argsort(rows.t0[rows.is_comm], kind="stable")]:
            kind = rows.kinds[rows.kind[i]]
            peer = int(rows.trace.col("peer")[i])
            if kind not in ("send", "recv") or peer < 0:
                continue
            group = rows.groups[rows.trace.col("group")[i]] if rows.trace.col("group")[i] >= 0 \
                else ""
            src, dst = (rank, peer) if kind == "send" else (peer, rank)
            queues.setdefault((group, src, dst), ([], []))[kind == "recv"].append(int(i))
    return [P2PLink(src, s, dst, r) for (_, src, dst), (sends, recvs) in sorted(queues.items())
            for s, r in zip(sends, recvs) if src in raw and dst in raw]


def _annotation_spans(rows: _RankRows):
    """Passes (F/B/W with micro-batch) and the other annotation ranges of one rank."""
    passes, others = [], []
    trace = rows.trace
    for i in np.nonzero(rows.op == rows.ann_code)[0].tolist():
        stack = trace.annotation(int(rows.annotation[i]))
        if not stack or rows.t1[i] < 0:
            continue
        own = stack[-1]
        label = str(own.get("label", ""))
        start, end, step = int(rows.t0[i]), int(rows.t1[i]), int(rows.step[i])
        found = pass_of(label, own)
        if found is not None:
            passes.append(Pass(rows.rank, step, found.kind, found.microbatch, found.chunk, start,
                               end, found.source))
        else:
            others.append((start, end, label, len(stack) - 1))
    return sorted(passes, key=lambda p: p.start), sorted(others)


def _infer_passes(rows: _RankRows, lane: RankLanes) -> list:
    """Passes from the P2P order when nothing names them: a run of forward (backward) compute
    ops is one F (B) pass; a recv starts a new pass and a send ends one. The k-th F (B) pass of
    a step gets micro-batch k: exact for GPipe and 1F1B, not for interleaved schedules."""
    if not any(c.kind in ("send", "recv") for c in lane.comm):
        return []
    phase = rows.trace.col("phase")
    order = np.nonzero(rows.is_compute | rows.is_comm)[0]
    ends = np.where(rows.is_comm, rows.t_ret, rows.t1)
    order = order[np.lexsort((ends[order], rows.t0[order]))]
    passes, current, counts = [], None, {}

    def close():
        if current is not None:
            kind, step, start, end = current
            k = counts.get((step, kind), 0)
            counts[(step, kind)] = k + 1
            passes.append(Pass(rows.rank, step, kind, k, 0, start, end, "inferred"))

    for i in order.tolist():
        if rows.is_comm[i]:
            kind = rows.kinds[rows.kind[i]]
            if kind == "recv" or kind == "send":
                close()
                current = None
            continue
        kind = {1: "F", 2: "B"}.get(int(phase[i]))
        step = int(rows.step[i])
        if kind is None:
            close()
            current = None
        elif current is None or current[0] != kind or current[1] != step:
            close()
            current = [kind, step, int(rows.t0[i]), int(rows.t1[i])]
        else:
            current[3] = int(rows.t1[i])
    close()
    return passes


def _lanes(rows: _RankRows, cap: dict) -> RankLanes:
    comm = _comm_spans(rows, cap)
    steps, closed = _step_windows(rows)
    passes, others = _annotation_spans(rows)
    group = {rows.rank}
    for c in comm:
        if c.kind in ("send", "recv") and c.group and not c.group.startswith("?"):
            group.update(int(r) for r in c.group.split(","))
    sel = rows.is_compute
    return RankLanes(
        rank=rows.rank, compute=_compute_spans(rows, comm), comm=comm,
        comm_union=union(_intervals([c.start for c in comm], [c.end for c in comm])),
        passes=passes, steps=steps, closed_steps=closed, op_start=rows.t0[sel], op_end=rows.t1[sel],
        op_name=rows.op[sel], op_thread=rows.thread[sel], op_names=rows.op_names,
        annotations=others, pipeline_group=tuple(sorted(group)),
        clock_error_ns=rows.trace.clock_error_ns)


# ---------------------------------------------------------------------------- metrics
def _seconds(ns: int) -> float:
    return ns / 1e9


def _ratio(num: int, den: int) -> Optional[float]:
    return num / den if den > 0 else None


def _pass_set(passes: list, step: int) -> np.ndarray:
    return union(_intervals([p.start for p in passes if p.step == step],
                            [p.end for p in passes if p.step == step]))


def _busy_edge(busy: np.ndarray, p: Pass, recvs: list, first: bool) -> int:
    """When pass ``p`` starts computing on its input (after the recvs it posted completed), or
    (first=False) when it stops computing; its bounds if it never computes."""
    ready = max((c.end for c in recvs if p.start <= c.start < p.end), default=p.start)
    inside = clip(busy, ready if first else p.start, p.end)
    if not len(inside):
        return p.start if first else p.end
    return int(inside[0, 0]) if first else int(inside[-1, 1])


def _pipeline_bubble(timeline: Timeline, lane: RankLanes, step: int) -> Optional[PipelineBubble]:
    """Bubble of ``lane`` in the step's pipeline window: from the first pass start to the last
    pass end over its pipeline group (aligned clocks)."""
    mine = [p for p in lane.passes if p.step == step]
    if not mine or len(lane.pipeline_group) < 2:
        return None
    group = [p for r in lane.pipeline_group if r in timeline.ranks
             for p in timeline.ranks[r].passes if p.step == step]
    lo, hi = min(p.start for p in group), max(p.end for p in group)
    busy = intersect(lane.compute, _pass_set(mine, step))
    # Warm-up lasts until the rank starts computing its first backward, cool-down starts when
    # it stops computing its last forward: waits at the head of a pass belong to the section
    # before it.
    recvs = [c for c in lane.comm if c.kind == "recv" and c.step == step]
    first_b = min((_busy_edge(busy, p, recvs, first=True) for p in mine if p.kind != "F"),
                  default=hi)
    last_f = max((_busy_edge(busy, p, recvs, first=False) for p in mine if p.kind == "F"),
                 default=first_b)
    cool = max(last_f, first_b)
    sections = [(lo, first_b), (first_b, cool), (cool, hi)]
    idle = [max(b - a, 0) - length(clip(busy, a, b)) for a, b in sections]
    window = hi - lo
    return PipelineBubble(_seconds(window), _seconds(sum(idle)), _ratio(sum(idle), window),
                          *(_ratio(x, window) for x in idle),
                          simulated_bubble_fraction=_simulated(timeline, lane, step))


def _until_sent(compute: np.ndarray, p: Pass, sends: list) -> int:
    """Compute of pass ``p`` up to its last send: when its output left for the next stage.
    Whatever the rank does after that (host work, a tracer flush) delays it, not the receiver."""
    inside = [t for t in sends if p.start <= t <= p.end]
    return length(clip(compute, p.start, inside[-1] if inside else p.end))


def _simulated(timeline: Timeline, lane: RankLanes, step: int) -> Optional[float]:
    """The bubble fraction ``lane`` would have if its pipeline group ran the same passes, in
    the same order, with the measured compute of each, and communication were free: each pass
    starts once its rank is free and the pass it depends on has sent its output. The gap
    between this and the measured bubble is what communication costs; the gap between this
    and the theory is stage imbalance and pass-time variance.

    None when passes lack micro-batch numbers or do not form a schedule."""
    group = [r for r in lane.pipeline_group if r in timeline.ranks]
    queues = {}
    for stage, rank in enumerate(group):
        other = timeline.ranks[rank]
        passes = [x for x in other.passes if x.step == step]
        if any(x.microbatch is None for x in passes):
            return None
        sends = sorted(c.start for c in other.comm if c.kind == "send" and c.step == step)
        queues[rank] = [((x.kind, x.microbatch, _virtual_stage(x, stage, len(group))),
                         length(clip(other.compute, x.start, x.end)),
                         _until_sent(other.compute, x, sends)) for x in passes]
    stages = 1 + max((key[2] for q in queues.values() for key, _, _ in q), default=0)
    stages = len(group) * -(-stages // len(group))     # whole chunks on every stage
    sent: dict = {}
    free = {rank: 0 for rank in group}
    position = {rank: 0 for rank in group}
    progress = True
    while progress:     # run every rank as far as its dependencies allow, until none can move
        progress = False
        for rank in group:
            while position[rank] < len(queues[rank]):
                key, busy, until_sent = queues[rank][position[rank]]
                dep = _dependency(*key, stages)
                if dep is not None and dep not in sent:
                    break
                start = max(free[rank], sent.get(dep, 0))
                free[rank], sent[key] = start + busy, start + until_sent
                position[rank] += 1
                progress = True
    if any(position[r] < len(queues[r]) for r in group):
        return None
    window = max(free.values())
    return _ratio(window - sum(busy for _, busy, _ in queues[lane.rank]), window)


def _virtual_stage(p: Pass, stage: int, stages: int) -> int:
    """torch.distributed.pipelining labels name the global stage; annotations the rank's
    chunk, which is virtual stage chunk*p + stage (Megatron's interleaving)."""
    return p.chunk if p.source == "record_function" else p.chunk * stages + stage


def _dependency(kind: str, microbatch: int, stage: int, stages: int) -> Optional[tuple]:
    """The pass whose output pass (kind, microbatch, virtual stage) needs, or None."""
    if kind == "F":
        return ("F", microbatch, stage - 1) if stage > 0 else None
    if kind == "W":
        return ("B", microbatch, stage)
    return ("B", microbatch, stage + 1) if stage < stages - 1 else ("F", microbatch, stage)


def _step_metrics(timeline: Timeline, lane: RankLanes, step: int) -> StepMetrics:
    lo, hi = lane.steps[step]
    compute, comm = clip(lane.compute, lo, hi), clip(lane.comm_union, lo, hi)
    overlapped = length(intersect(compute, comm))
    busy = length(compute)
    comm_ns = length(comm)
    wall = hi - lo
    idle = wall - length(union(np.concatenate([compute, comm])))
    return StepMetrics(step, lo, hi, _seconds(wall), _seconds(busy), _seconds(comm_ns),
                       _seconds(overlapped), _seconds(comm_ns - overlapped), _seconds(idle),
                       _ratio(overlapped, comm_ns), _ratio(wall - busy, wall),
                       _pipeline_bubble(timeline, lane, step))


def _pass_compute(timeline: Timeline, counted: dict) -> dict:
    """Mean compute seconds per pass kind over the counted steps of every rank."""
    total: dict = {}
    for rank, lane in timeline.ranks.items():
        for p in lane.passes:
            if p.step in counted.get(rank, ()):
                busy = length(clip(lane.compute, p.start, p.end))
                n, s = total.get(p.kind, (0, 0))
                total[p.kind] = (n + 1, s + busy)
    return {k: _seconds(s) / n for k, (n, s) in sorted(total.items())}


def _theory(config: dict, pass_s: dict) -> Optional[float]:
    try:
        p, m = int(config.get("pp") or 0), int(config.get("microbatches") or 0)
        v = int(config.get("virtual_stages") or 1)
    except (TypeError, ValueError):
        return None
    times = {}
    if "W" in pass_s:
        times = dict(t_f=pass_s.get("F", 0.0), t_b=pass_s.get("B", 0.0), t_w=pass_s["W"])
    return theoretical_bubble(str(config.get("schedule") or ""), p, m, v, **times)


def metrics_of(timeline: Timeline) -> dict:
    """rank -> RankMetrics of a built timeline."""
    counted = {r: _counted(lane) for r, lane in timeline.ranks.items()}
    pass_s = _pass_compute(timeline, counted)
    theory = _theory(timeline.config, pass_s) if any(
        lane.passes for lane in timeline.ranks.values()) else None
    out = {}
    for rank, lane in timeline.ranks.items():
        steps = [_step_metrics(timeline, lane, s) for s in sorted(lane.steps)]
        use = [s for s in steps if s.step in counted[rank]]
        m = RankMetrics(rank, steps, tuple(counted[rank]), theoretical_bubble_fraction=theory,
                        passes=pass_s)
        if lane.clock_error_ns is not None:
            m.clock_error_s = _seconds(lane.clock_error_ns)
        for key in ("wall_s", "compute_s", "comm_s", "overlapped_comm_s", "exposed_comm_s",
                    "idle_s"):
            setattr(m, key, sum(getattr(s, key) for s in use))
        m.overlap_fraction = m.overlapped_comm_s / m.comm_s if m.comm_s > 0 else None
        m.bubble_fraction = (m.wall_s - m.compute_s) / m.wall_s if m.wall_s > 0 else None
        pipes = [s.pipeline for s in use if s.pipeline is not None]
        if pipes:
            window = sum(p.window_s for p in pipes)
            parts = [sum(getattr(p, k) * p.window_s for p in pipes if getattr(p, k) is not None)
                     for k in ("warmup_fraction", "steady_fraction", "cooldown_fraction")]
            bubble = sum(p.bubble_s for p in pipes)
            sims = [p for p in pipes if p.simulated_bubble_fraction is not None]
            sim = sum(p.simulated_bubble_fraction * p.window_s for p in sims)
            m.pipeline = PipelineBubble(window, bubble, _ratio(bubble, window),
                                        *(_ratio(x, window) for x in parts),
                                        _ratio(sim, sum(p.window_s for p in sims)))
        out[rank] = m
    return out


def run_metrics(run: Run) -> dict:
    """rank -> :class:`RankMetrics` for every readable rank of ``run`` (docs/metrics.md)."""
    return metrics_of(build_timeline(run))


def write_timeline(run: Run, out_dir: str) -> dict:
    """Write ``timeline.svg`` and ``timeline.json`` (Chrome trace) into ``out_dir``; returns
    their paths relative to it."""
    from .render import chrome_trace, timeline_svg
    timeline = build_timeline(run)
    metrics = metrics_of(timeline)
    os.makedirs(out_dir, exist_ok=True)
    files = {"svg": "timeline.svg", "chrome_trace": "timeline.json"}
    with open(os.path.join(out_dir, files["svg"]), "w") as fh:
        fh.write(timeline_svg.render(timeline, metrics))
    with open(os.path.join(out_dir, files["chrome_trace"]), "w") as fh:
        fh.write(chrome_trace.render(timeline))
    return files
