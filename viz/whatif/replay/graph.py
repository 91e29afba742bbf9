"""The execution graph of a recording: each rank's program over its counted steps, and the
communications that tie the programs together.

A rank's program is the order its lane ran things in (the compute lane of the timeline: every
thread's ops and the host time between them on the host clock, the GPU's kernels on the device
clock), as a list of :class:`Node` s:

- ``COMPUTE`` ns: the rank computed for that long;
- ``LAUNCH`` comm: it launched a collective or P2P operation (returning at once: a blocking call
  is a launch followed by a wait);
- ``WAIT`` comm: it could not go on before that communication completed (a hole in the compute
  lane that ends when the communication completed: a recv's wait, a blocking collective,
  ``Work.wait()``);
- ``IDLE`` ns: time without compute that no completion explains (kept as it was measured);
- ``BEGIN`` / ``END`` pass: the bounds of an F, B or W pass (:class:`PassKey`);
- ``STEP`` step: a step starts.

A :class:`Comm` is one collective over its members (matched across ranks by group and sequence
number, :mod:`viz.analysis.crossrank`) or one send matched with its receive
(:func:`viz.analysis.timeline.match_p2p`): it completes for member r at the last member's launch
plus ``transfer[r]``, the measured time from the last arrival to r's completion (when r had
the result; in traces whose completions may be late, :mod:`viz.whatif.replay.waits`). A
communication whose other members are not in the graph (their step was not counted, the
collective did not match) completes its own measured duration after its launch.

Replaying these programs with their measured durations reproduces the recording
(:mod:`viz.whatif.replay.simulate`); the transformations edit them
(:mod:`viz.whatif.replay.compose`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Optional

import numpy as np

from tracer.vocab.groups import group_ranks
from tracer.vocab.ops import P2P_KINDS

from ...analysis.timeline.intervals import Prefix, gaps
from ...analysis.timeline.lanes import Timeline, counted_steps
from .waits import RankView, hidden_waits, rank_view

COMPUTE, IDLE, LAUNCH, WAIT, BEGIN, END, STEP = range(7)
P2P = P2P_KINDS


class Node(NamedTuple):
    """One item of a rank's program: ``op`` is COMPUTE .. STEP; ``value`` ns (COMPUTE, IDLE),
    a comm id (LAUNCH, WAIT), a pass id (BEGIN, END) or a step (STEP)."""

    op: int
    value: int


class PassKey(NamedTuple):
    """One pass of a program: its rank, step, kind (F, B, W), micro-batch and chunk (the rank's
    model chunk; torch.distributed.pipelining's passes: the global stage)."""

    rank: int
    step: int
    kind: str
    microbatch: Optional[int]
    chunk: int
    source: str = "annotation"


@dataclass
class Comm:
    """One collective, or one send with its receive."""

    kind: str                  # all_reduce, ..., or "p2p" for a send matched with its recv
    group: tuple               # the process group's global ranks
    nbytes: int                # what one member hands in (a P2P message's size)
    members: tuple             # ranks whose programs launch it
    transfer: dict             # rank -> ns from the last member's launch to its completion
    role: str = ""             # what it is for in a prediction: tp, dp, grad_sync, pp, ...
    group_text: str = ""       # the trace's text of the group (apart same-rank groups)
    src: Optional[int] = None  # P2P: sender and receiver
    dst: Optional[int] = None
    kinds: dict = field(default_factory=dict)   # rank -> its own kind (P2P: send | recv)
    waited: bool = False       # a member waited for it: its completion was seen, not late
    lateness: dict = field(default_factory=dict)   # rank -> its launch - the members' mean
    prompt: bool = False       # a member waited for it in the part it launched it in

    def kind_on(self, rank: int) -> str:
        return self.kinds.get(rank, self.kind)

    def peer_of(self, rank: int) -> Optional[int]:
        if self.src is None:
            return None
        return self.dst if rank == self.src else self.src


@dataclass
class ExecutionGraph:
    """Every rank's program, the communications and passes they name, and where each program
    started on rank 0's clock (ns)."""

    programs: dict             # rank -> list of Node
    comms: list                # Comm, by id
    passes: list               # PassKey, by id
    starts: dict               # rank -> the first counted step's start
    config: dict = field(default_factory=dict)
    clock: str = "host"
    pipeline_groups: dict = field(default_factory=dict)   # rank -> its pipeline's ranks

    def add_comm(self, comm: Comm) -> int:
        self.comms.append(comm)
        return len(self.comms) - 1

    def add_pass(self, key: PassKey) -> int:
        self.passes.append(key)
        return len(self.passes) - 1


def execution_graph(timeline: Timeline, matched: list,
                    late: frozenset = frozenset()) -> ExecutionGraph:
    """The graph of every rank's counted steps. ``matched``: viz.analysis.crossrank.matching's matched
    collectives (:attr:`viz.analysis.crossrank.CrossRank.matched`); ``late``: the ranks whose
    recorded completions may have come late (:func:`viz.whatif.replay.waits.late_completions`),
    whose
    hidden waits are taken out of their compute."""
    ranks = timeline.ranks
    windows = {r: {s: lane.steps[s] for s in counted_steps(lane)} for r, lane in ranks.items()}
    graph = ExecutionGraph({}, [], [], {}, dict(timeline.config),
                           _clock(timeline), {r: tuple(l.pipeline_group) for r, l in ranks.items()})
    spans = {r: _spans_in(lane, windows[r]) for r, lane in ranks.items()}
    views = _views(ranks, matched, late)
    ids = _communications(graph, timeline, matched, spans, views)
    for rank, lane in ranks.items():
        graph.programs[rank] = _program(graph, lane, views[rank], windows[rank], spans[rank],
                                        ids)
        graph.starts[rank] = min((w[0] for w in windows[rank].values()), default=0)
    return graph


def _clock(timeline: Timeline) -> str:
    clocks = {lane.clock for lane in timeline.ranks.values()}
    return "device" if "device" in clocks else "host"


def _views(ranks: dict, matched: list, late: frozenset) -> dict:
    """rank -> RankView; on the ``late`` ranks with the hidden waits (viz.whatif.replay.waits) that
    end after the last member of their collective launched it: a rank cannot have had the
    result before."""
    last = {(r, c.index): m.last_arrival for m in matched for r, c in m.spans.items()}
    views = {}
    for rank, lane in ranks.items():
        hidden = hidden_waits(lane) if rank in late else {}
        waits = {i: w for i, w in hidden.items() if w[1] >= last.get((rank, i), w[1])}
        views[rank] = rank_view(lane, waits)
    return views


def _spans_in(lane, windows: dict) -> dict:
    """trace row -> CommSpan of the rank's communications launched in its counted steps."""
    out = {}
    for span in lane.comm:
        window = windows.get(span.step)
        if window is not None and window[0] <= span.start < window[1]:
            out[span.index] = span
    return out


def _communications(graph: ExecutionGraph, timeline: Timeline, matched: list, spans: dict,
                    views: dict) -> dict:
    """(rank, trace row) -> comm id, for every communication launched in a counted step."""
    ids: dict = {}
    for link in timeline.links:
        send, recv = spans.get(link.src, {}).get(link.src_index), \
            spans.get(link.dst, {}).get(link.dst_index)
        if send is None or recv is None:
            continue
        arrival = max(send.start, recv.start)
        ids[(link.src, link.src_index)] = ids[(link.dst, link.dst_index)] = graph.add_comm(Comm(
            "p2p", tuple(sorted({link.src, link.dst})), recv.nbytes, (link.src, link.dst),
            {link.src: max(send.end - arrival, 0), link.dst: max(recv.end - arrival, 0)},
            "", recv.group, link.src, link.dst,
            {link.src: "send", link.dst: "recv"}))
    for m in matched:
        members = {r: c for r, c in m.spans.items() if c.index in spans.get(r, {})}
        if len(members) != len(m.spans):
            continue                  # a member's launch is outside its counted steps
        last = max(c.start for c in members.values())
        any_rank = min(members)
        comm = Comm(m.kind, tuple(group_ranks(m.group)), members[any_rank].nbytes,
                    tuple(sorted(members)),
                    {r: max(views[r].done[c.index] - last, 0) for r, c in members.items()},
                    "", m.group)
        middle = sum(c.start for c in members.values()) / len(members)
        comm.lateness = {r: int(c.start - middle) for r, c in members.items()}
        cid = graph.add_comm(comm)
        for r, c in members.items():
            ids[(r, c.index)] = cid
    for rank, mine in spans.items():
        for index, span in mine.items():
            if (rank, index) not in ids:       # completes on its own measured duration
                ids[(rank, index)] = graph.add_comm(Comm(
                    span.kind, tuple(group_ranks(span.group)) if span.group else (rank,),
                    span.nbytes, (rank,), {rank: max(views[rank].done[index] - span.start, 0)},
                    "", span.group,
                    *((rank, span.peer) if span.kind == "send" else (span.peer, rank))
                    if span.kind in P2P and span.peer is not None else (None, None),
                    {rank: span.kind}))
    return ids


# event priorities at one instant: a send (a pass's output) before its pass ends, the next
# pass begins, then other launches (a recv: the next pass's input), then holes
_SEND, _END, _BEGIN, _LAUNCH, _HOLE = range(5)
_NODE_OF = {_SEND: LAUNCH, _LAUNCH: LAUNCH, _BEGIN: BEGIN, _END: END}


def _program(graph: ExecutionGraph, lane, view: RankView, windows: dict, spans: dict,
             ids: dict) -> list:
    """The rank's program over its counted steps (see the module docstring)."""
    compute = Prefix(view.compute)
    ends = sorted((view.done[s.index], s.index) for s in lane.comm
                  if s.completed and not s.capped)
    end_times = np.array([e for e, _ in ends], np.int64)
    program: list = []
    by_step: dict = {}
    for p in lane.passes:
        by_step.setdefault(p.step, []).append(p)
    for step, (lo, hi) in sorted(windows.items()):
        events = [(s.start, _SEND if s.kind == "send" else _LAUNCH, ids[(lane.rank, i)])
                  for i, s in spans.items()
                  if s.step == step]
        for p in by_step.get(step, []):
            pid = graph.add_pass(PassKey(lane.rank, step, p.kind, p.microbatch, p.chunk,
                                         p.source))
            events += [(p.start, _BEGIN, pid), (p.end, _END, pid)]
        for h0, h1 in gaps(view.compute, lo, hi).tolist():
            why = _explained(h0, h1, end_times, ends, lane.rank, ids)
            if why is not None:
                graph.comms[why[0]].waited = True
            events.append((h0, _HOLE, (h1, why)))
        program.append(Node(STEP, step))
        _walk(program, sorted(events, key=lambda e: (e[0], e[1])), compute, lo, hi)
    _mark_prompt(graph, program)
    return program


def _mark_prompt(graph: ExecutionGraph, program: list) -> None:
    """Mark the communications the rank waited for before a pass or step boundary."""
    part, launched = 0, {}
    for op, value in program:
        if op in (BEGIN, END, STEP):
            part += 1
        elif op == LAUNCH:
            launched[value] = part
        elif op == WAIT and launched.get(value) == part:
            graph.comms[value].prompt = True


def _explained(h0: int, h1: int, end_times: np.ndarray, ends: list, rank: int, ids: dict):
    """(comm id, completion) of the last communication of the rank that completed inside the
    hole (h0, h1]: what the rank waited for; None if nothing completed in it."""
    i = int(np.searchsorted(end_times, h1, side="right")) - 1
    if i < 0 or end_times[i] <= h0:
        return None
    cid = ids.get((rank, ends[i][1]))
    return None if cid is None else (cid, int(end_times[i]))


def _walk(program: list, events: list, compute: Prefix, lo: int, hi: int) -> None:
    """Append the nodes of one step: compute between events, each event, each hole as a wait
    (then the time from the completion to the hole's end, idle) or as idle."""
    t = lo
    hole = None                       # (end, explained) of the hole under way

    def close_hole():
        end, why = hole
        if why is None:
            program.append(Node(IDLE, end - hole_start))
        else:
            cid, done = why
            program.append(Node(WAIT, cid))
            if end > done:
                program.append(Node(IDLE, end - done))

    for time, kind, value in events:
        if hole is not None and time >= hole[0]:
            close_hole()
            hole = None
        busy = int(compute.length(t, time)) if time > t else 0
        if busy > 0:
            program.append(Node(COMPUTE, busy))
        t = max(t, time)
        if kind == _HOLE:
            hole, hole_start = value, time
            t = max(t, value[0])
        else:
            program.append(Node(_NODE_OF[kind], value))
    if hole is not None:
        close_hole()
    busy = int(compute.length(t, hi)) if hi > t else 0
    if busy > 0:
        program.append(Node(COMPUTE, busy))
