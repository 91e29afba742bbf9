"""Run an execution graph: every rank's program at once, communications completing when their
last member has launched them plus their transfer time.

Each rank runs its program as far as it can: compute and idle take their time, a launch records
the rank's arrival, a wait blocks until the communication completed for this rank. When no rank
can move and a program is unfinished, the graph deadlocks (a prediction whose ranks disagree
about the collectives they issue): :class:`SimulationError` names where. The result is laid out
as a :class:`viz.analysis.timeline.lanes.Timeline`, so the timeline's own metrics
(:func:`viz.analysis.timeline.metrics.metrics_of`) and drawing (:mod:`viz.render.timeline_svg`) read a
simulated run as they read a measured one.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tracer.vocab.groups import group_text

from ...analysis.timeline.intervals import intervals, union
from ...analysis.timeline.lanes import CommSpan, Pass, RankLanes, Timeline
from .graph import BEGIN, COMPUTE, END, ExecutionGraph, IDLE, LAUNCH, STEP, WAIT


class SimulationError(ValueError):
    """The graph cannot run to its end; the message is one line."""


@dataclass
class RankRun:
    """What one rank did in the simulation (times in ns)."""

    compute: list = field(default_factory=list)     # (start, end)
    launches: list = field(default_factory=list)    # (comm id, launch)
    passes: dict = field(default_factory=dict)      # pass id -> [start, end]
    steps: list = field(default_factory=list)       # (step, start)
    end: int = 0


@dataclass
class Simulated:
    runs: dict                 # rank -> RankRun
    done: dict                 # comm id -> rank -> completion


def simulate(graph: ExecutionGraph, starts: dict = None) -> Simulated:
    """Run every program; ``starts``: rank -> when its program starts (default: every rank
    at 0)."""
    starts = starts or {}
    programs = graph.programs
    ranks = sorted(programs)
    clock = {r: int(starts.get(r, 0)) for r in ranks}
    position = {r: 0 for r in ranks}
    runs = {r: RankRun() for r in ranks}
    arrivals: dict = {}
    done: dict = {}                  # comm id -> rank -> completion
    progress = True
    while progress:
        progress = False
        for rank in ranks:
            moved = _run_rank(rank, programs[rank], position, clock, runs[rank], graph.comms,
                              arrivals, done)
            progress = progress or moved
    stuck = [r for r in ranks if position[r] < len(programs[r])]
    if stuck:
        rank = stuck[0]
        comm = graph.comms[programs[rank][position[rank]].value]
        absent = [m for m in comm.members if m not in arrivals.get(
            programs[rank][position[rank]].value, {})]
        raise SimulationError(
            f"the graph deadlocks: rank {rank} waits for a {comm.kind} over ranks "
            f"{list(comm.group)} that rank(s) {absent} never launch")
    for rank in ranks:
        runs[rank].end = clock[rank]
    return Simulated(runs, done)


def _run_rank(rank: int, program: list, position: dict, clock: dict, run: RankRun,
              comms: list, arrivals: dict, done: dict) -> bool:
    """Run ``rank`` until it blocks or ends; True if it moved."""
    i, t = position[rank], clock[rank]
    start = i
    while i < len(program):
        op, value = program[i]
        if op == COMPUTE:
            run.compute.append((t, t + value))
            t += value
        elif op == IDLE:
            t += value
        elif op == LAUNCH:
            mine = arrivals.setdefault(value, {})
            mine[rank] = t
            run.launches.append((value, t))
            comm = comms[value]
            if len(mine) == len(comm.members):
                last = max(mine.values())
                done[value] = {r: last + int(comm.transfer.get(r, 0)) for r in comm.members}
        elif op == WAIT:
            finished = done.get(value)
            if finished is None:
                break
            t = max(t, finished[rank])
        elif op == BEGIN:
            run.passes[value] = [t, t]
        elif op == END:
            run.passes.setdefault(value, [t, t])[1] = t
        elif op == STEP:
            run.steps.append((value, t))
        i += 1
    position[rank], clock[rank] = i, t
    return i > start


def as_timeline(graph: ExecutionGraph, sim: Simulated, config: dict) -> Timeline:
    """The simulated run as a Timeline (every step closed, steps numbered as the programs
    number them)."""
    lanes = {}
    for rank, run in sim.runs.items():
        lanes[rank] = _lanes(graph, rank, run, sim.done,
                             graph.pipeline_groups.get(rank, (rank,)))
    origin = min((w[0] for lane in lanes.values() for w in lane.steps.values()), default=0)
    return Timeline(dict(sorted(lanes.items())), [], dict(config), origin)


def _lanes(graph: ExecutionGraph, rank: int, run: RankRun, done: dict, group: tuple
           ) -> RankLanes:
    steps = {}
    marks = run.steps + [(None, run.end)]
    for (step, a), (_, b) in zip(marks, marks[1:]):
        steps[step] = (a, max(b, a + 1))
    step_at = [a for _, a in run.steps]
    comm = []
    for index, (cid, launch) in enumerate(run.launches):
        c = graph.comms[cid]
        end = done.get(cid, {}).get(rank, launch)
        step = run.steps[max(np.searchsorted(step_at, launch, side="right") - 1, 0)][0] \
            if run.steps else 0
        comm.append(CommSpan(rank, index, c.kind_on(rank), step, launch, max(end, launch),
                             c.peer_of(rank), c.group_text or group_text(c.group), c.nbytes,
                             True))
    comm.sort(key=lambda s: s.start)
    passes = sorted((Pass(rank, key.step, key.kind, key.microbatch, key.chunk, a, b, key.source)
                     for pid, (a, b) in run.passes.items()
                     for key in (graph.passes[pid],)), key=lambda p: (p.start, p.end))
    compute = union(intervals([a for a, _ in run.compute], [b for _, b in run.compute]))
    empty = np.zeros(0, np.int64)
    return RankLanes(
        rank=rank, compute=compute, comm=comm,
        comm_union=union(intervals([c.start for c in comm], [c.end for c in comm])),
        passes=passes, steps=steps, closed_steps=frozenset(steps), op_start=empty,
        op_end=empty, op_name=empty, op_thread=empty, op_names=[], hidden_ops=0,
        annotations=[], schedules={}, pipeline_group=tuple(group), clock_error_ns=None,
        recorded_until=run.end, clock=graph.clock)
