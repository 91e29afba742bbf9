"""Programs of a target configuration, rebuilt from the recorded parts of a step.

Every rank of the target's grid gets, per step: the recorded work before the first pass (its
compute scaled by the micro-batch count), its schedule's passes in order (the reference GPT's
orders, tracer.vocab.schedules), the host work between passes, and the work after the last pass. A
pass is a :class:`Body`: its compute and, at their places in it, its communications: the P2P
receive of its input (waited at its start) and the send of its output (at its end) between virtual
stages, the tensor-parallel collectives inside it, and the data-parallel gradient buckets a last
backward launches. :mod:`viz.whatif.reference_gpt.plan` decides what
each body holds; this module lays the programs out and ties their communications together:
the k-th collective a rank issues on a group is the k-th of every member (as c10d matches
them), a send and its receive share (step, pass kind, micro-batch, receiving virtual stage).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from tracer.vocab.groups import group_text
from tracer.vocab.ops import P2P_KINDS

from .graph import (BEGIN, COMPUTE, Comm, END, ExecutionGraph, IDLE, LAUNCH, Node, PassKey, STEP,
                    WAIT)


@dataclass
class Call:
    """A communication inside a body or the post part, before it is tied to its members.

    ``kind``: a collective's kind, or "recv"/"send" (P2P); ``group``: the collective's ranks,
    or the P2P peer as a 1-tuple; ``key``: the P2P message; ``wait``: place of its wait
    (None: not waited here; a bucket is waited in the post part)."""

    kind: str
    group: tuple
    nbytes: int
    ns: float                         # its transfer time
    role: str = ""
    key: Optional[tuple] = None
    wait: Optional[float] = None      # compute before the wait, in the same part


@dataclass
class Body:
    """A stretch of work: compute and idle (ns), and its calls at their places."""

    compute: float
    idle: float = 0.0
    calls: list = field(default_factory=list)      # (compute before the launch, Call)


class Programs:
    """Builds the programs of every rank of a target, tying communications across ranks."""

    def __init__(self, clock: str):
        self.graph = ExecutionGraph({}, [], [], {}, clock=clock)
        self._collectives: dict = {}  # (group, index) -> comm id
        self._issued: dict = {}       # (rank, group) -> collectives issued so far
        self._p2p: dict = {}          # message key -> comm id
        self._kinds: dict = {}

    def start(self, rank: int) -> list:
        self.graph.programs[rank] = []
        return self.graph.programs[rank]

    def step(self, rank: int, step: int) -> None:
        self.graph.programs[rank].append(Node(STEP, step))

    def work(self, rank: int, body: Body, pass_key: Optional[PassKey] = None) -> list:
        """Append ``body`` (inside BEGIN/END of ``pass_key`` if given); returns the comm ids
        of its calls not waited inside it, in launch order."""
        program = self.graph.programs[rank]
        if pass_key is not None:
            pid = self.graph.add_pass(pass_key)
            program.append(Node(BEGIN, pid))
        events = []
        unwaited = []
        for at, call in body.calls:
            cid = self._comm(rank, call)
            events.append((at, 0, LAUNCH, cid))
            if call.wait is not None:
                events.append((max(call.wait, at), 1, WAIT, cid))
            else:
                unwaited.append((call, cid))
        done = 0                      # ns of compute emitted (rounded places: no drift)
        for at, _, op, cid in sorted(events, key=lambda e: (e[0], e[1])):
            at = int(round(min(max(at, 0.0), body.compute)))
            if at > done:
                program.append(Node(COMPUTE, at - done))
                done = at
            program.append(Node(op, cid))
        if int(round(body.compute)) > done:
            program.append(Node(COMPUTE, int(round(body.compute)) - done))
        if body.idle >= 1:
            program.append(Node(IDLE, int(round(body.idle))))
        if pass_key is not None:
            program.append(Node(END, pid))
        return unwaited

    def wait(self, rank: int, cid: int) -> None:
        self.graph.programs[rank].append(Node(WAIT, cid))

    def compute(self, rank: int, ns: float, idle: bool = False) -> None:
        """Append compute (or idle time) of ``ns``, merged with the node before it."""
        program, op = self.graph.programs[rank], IDLE if idle else COMPUTE
        ns = int(round(ns))
        if ns <= 0:
            return
        if program and program[-1].op == op:
            program[-1] = Node(op, program[-1].value + ns)
        else:
            program.append(Node(op, ns))

    def launch(self, rank: int, call: Call) -> int:
        """Append the launch of ``call``; its comm id (tied across ranks as :meth:`work`
        ties them)."""
        cid = self._comm(rank, call)
        self.graph.programs[rank].append(Node(LAUNCH, cid))
        return cid

    def _comm(self, rank: int, call: Call) -> int:
        if call.kind in P2P_KINDS:
            cid = self._p2p.get(call.key)
            if cid is None:
                peer = call.group[0]
                src, dst = (rank, peer) if call.kind == "send" else (peer, rank)
                cid = self._p2p[call.key] = self.graph.add_comm(Comm(
                    "p2p", tuple(sorted((src, dst))), call.nbytes, (src, dst),
                    {src: int(call.ns), dst: int(call.ns)}, call.role or "pp", "", src, dst,
                    {src: "send", dst: "recv"}))
            return cid
        group = tuple(call.group)
        index = self._issued.get((rank, group), 0)
        self._issued[(rank, group)] = index + 1
        cid = self._collectives.get((group, index))
        if cid is None:
            cid = self._collectives[(group, index)] = self.graph.add_comm(Comm(
                call.kind, group, call.nbytes, group, {r: int(call.ns) for r in group},
                call.role, group_text(group)))
            self._kinds[cid] = (call.kind, rank)
        elif self.graph.comms[cid].kind != call.kind:
            kind, first = self._kinds[cid]
            raise ValueError(f"ranks disagree on collective #{index} of group {list(group)}: "
                             f"rank {first} issues a {kind}, rank {rank} a {call.kind}")
        return cid


def spread(calls: list, compute: float) -> list:
    """(place, call) of blocking ``calls`` spread evenly over ``compute``."""
    n = len(calls)
    out = []
    for i, call in enumerate(calls):
        at = compute * (i + 0.5) / n
        out.append((at, Call(call.kind, call.group, call.nbytes, call.ns, call.role, call.key,
                             at)))
    return out
