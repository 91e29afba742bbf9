"""What a recorded step is made of, per rank: the work before the first pass, each pass (its
compute and, at their places in it, the communications it launched and waited for), the host
work between passes, and the work after the last pass (gradient synchronisation, optimizer).

Read from a rank's program (:mod:`viz.whatif.replay.graph`); the transformations rebuild programs of
another configuration from these parts (:mod:`viz.whatif.replay.compose`). A place inside a part is
the compute done in the part before it, so parts can be stretched (another compute time) and
their communications stay at the same share of the work.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..replay.graph import BEGIN, COMPUTE, END, IDLE, LAUNCH, STEP, WAIT, ExecutionGraph


@dataclass
class Part:
    """A stretch of a program: its compute and idle time, and its events at their places."""

    compute: float = 0.0
    idle: float = 0.0
    events: list = field(default_factory=list)      # (compute before it, LAUNCH|WAIT, comm id)

    def add(self, op: int, value: int) -> None:
        if op == COMPUTE:
            self.compute += value
        elif op == IDLE:
            self.idle += value
        elif op in (LAUNCH, WAIT):
            self.events.append((self.compute, op, value))


@dataclass
class PassPart:
    """One recorded pass: which, its body, and the host work after it until the next pass
    (None for a step's last pass)."""

    kind: str
    microbatch: Optional[int]
    chunk: int
    step: int
    body: Part
    after: Optional[Part] = None


@dataclass
class RankAnatomy:
    """A rank's counted steps, cut into parts."""

    rank: int
    pre: list = field(default_factory=list)       # Part per step
    passes: list = field(default_factory=list)    # PassPart, every step's
    post: list = field(default_factory=list)      # Part per step
    steps: int = 0

    def of(self, kind: str, chunk: int) -> list:
        return [p for p in self.passes if p.kind == kind and p.chunk == chunk]

    @property
    def chunks(self) -> list:
        return sorted({p.chunk for p in self.passes})


def anatomy(graph: ExecutionGraph) -> dict:
    """rank -> :class:`RankAnatomy` of every program of ``graph``."""
    try:
        pp = max(int(graph.config.get("pp") or 1), 1)
    except (TypeError, ValueError):
        pp = 1
    return {rank: _cut(graph, rank, program, pp) for rank, program in graph.programs.items()}


def local_chunk(key, pp: int) -> int:
    """The rank's chunk of a pass: torch.distributed.pipelining's passes name the global
    stage, which is chunk * pp + rank in its looped placement."""
    return key.chunk // pp if key.source in ("schedule", "record_function") else key.chunk


def _cut(graph: ExecutionGraph, rank: int, program: list, pp: int) -> RankAnatomy:
    out = RankAnatomy(rank)
    part: Optional[Part] = None
    current: Optional[PassPart] = None      # the pass under way, or the last one ended
    in_pass = False
    for op, value in program:
        if op == STEP:
            _close_step(out, current, part, in_pass)
            out.steps += 1
            part, current, in_pass = Part(), None, False
            out.pre.append(part)
        elif op == BEGIN:
            key = graph.passes[value]
            if current is not None:
                current.after = part
            current = PassPart(key.kind, key.microbatch, local_chunk(key, pp), key.step,
                               Part())
            out.passes.append(current)
            part, in_pass = current.body, True
        elif op == END:
            part, in_pass = Part(), False
        elif part is not None:
            part.add(op, value)
    _close_step(out, current, part, in_pass)
    return out


def _close_step(out: RankAnatomy, last: Optional[PassPart], part: Optional[Part],
                in_pass: bool) -> None:
    """The part after a step's last pass is the step's post part (the pre part itself when
    the step had no pass)."""
    if part is None:
        return
    if last is None:
        out.post.append(Part())
    elif not in_pass:
        out.post.append(part)
    else:
        out.post.append(Part())


def mean(values) -> float:
    """The mean of numbers (statistics.mean's exact fractions cost seconds on big runs)."""
    values = list(values)
    return sum(values) / len(values) if values else 0.0


def mean_part(parts: list, keep=lambda event: True) -> Part:
    """A part of the mean compute and idle of ``parts``, with the events (those ``keep``
    accepts) of the one of median compute, their places stretched to the mean."""
    if not parts:
        return Part()
    compute = mean(p.compute for p in parts)
    typical = sorted(parts, key=lambda p: p.compute)[len(parts) // 2]
    scale = compute / typical.compute if typical.compute > 0 else 1.0
    events = [(at * scale, op, cid) for at, op, cid in typical.events if keep((at, op, cid))]
    return Part(compute, mean(p.idle for p in parts), events)
