"""The replayed pipeline bubble: what the bubble would be if communication were free.

For each pipeline group and step, the measured passes run again in the same order, each taking
the compute it measured: a pass starts once its rank is free and the pass it depends on has sent
its output (docs/oracles.md's dependency simulation, with measured times). The gap between the
measured bubble and this one is what communication costs; the gap between this one and the
papers' theory is stage imbalance and pass-time variance (docs/metrics.md).

One replay per (pipeline group, step) serves every rank of the group; each pass costs two
prefix-sum lookups of its rank's compute, so a step replays in O(passes log n).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Optional, Protocol, TypeVar

import numpy as np

from tracer.vocab.labels import PassSource

from .intervals import Prefix
from .lanes import Pass, Timeline

# (pass kind, micro-batch, virtual stage): a pass of a schedule (a replay has every micro-batch)
_PassKey = tuple[str, Optional[int], int]
_V = TypeVar("_V")


class ByStep(Protocol[_V]):
    """(rank, step) -> what a rank did in the step (viz.analysis.timeline.metrics' index)."""

    def __contains__(self, key: object) -> bool: ...
    def get(self, key: tuple[int, int], default: _V) -> _V: ...


def replayed_bubbles(timeline: Timeline, passes: ByStep[list[Pass]], sends: ByStep[list[int]],
                     compute: Mapping[int, Prefix]) -> dict[tuple[int, int], Optional[float]]:
    """(rank, step) -> replayed bubble fraction (None where passes do not form a schedule).

    ``passes``: (rank, step) -> passes in start order; ``sends``: (rank, step) -> sorted send
    starts; ``compute``: rank -> viz.analysis.timeline.intervals.Prefix of its compute."""
    out: dict[tuple[int, int], Optional[float]] = {}
    done: dict[tuple[tuple[int, ...], int], Optional[dict[int, Optional[float]]]] = {}
    for rank, lane in timeline.ranks.items():
        group = tuple(r for r in lane.pipeline_group if r in timeline.ranks)
        if len(group) < 2:
            continue
        for step in lane.steps:
            if (rank, step) not in passes:
                continue
            key = (group, step)
            if key not in done:
                done[key] = _replay(group, step, passes, sends, compute)
            replayed = done[key]
            out[(rank, step)] = replayed.get(rank) if replayed is not None else None
    return out


def _replay(group: tuple[int, ...], step: int, passes: ByStep[list[Pass]],
            sends: ByStep[list[int]], compute: Mapping[int, Prefix]
            ) -> Optional[dict[int, Optional[float]]]:
    """rank -> replayed bubble fraction of one group's step, or None if it cannot replay."""
    queues: dict[int, list[tuple[_PassKey, float, float]]] = {}
    for stage, rank in enumerate(group):
        mine = passes.get((rank, step), [])
        if any(p.microbatch is None for p in mine):
            return None
        works, untils = _pass_work(mine, np.asarray(sends.get((rank, step), []), np.int64),
                                   compute[rank])
        queues[rank] = [((p.kind, p.microbatch, _virtual_stage(p, stage, len(group))), w, u)
                        for p, w, u in zip(mine, works, untils)]
    stages = 1 + max((key[2] for q in queues.values() for key, _, _ in q), default=0)
    stages = len(group) * -(-stages // len(group))     # whole chunks on every stage
    sent: dict[_PassKey, float] = {}
    free: dict[int, float] = {rank: 0 for rank in group}
    position = {rank: 0 for rank in group}
    progress = True
    while progress:     # run every rank as far as its dependencies allow, until none can move
        progress = False
        for rank in group:
            queue = queues[rank]
            while position[rank] < len(queue):
                key, work, until_sent = queue[position[rank]]
                dep = _dependency(*key, stages)
                if dep is not None and dep not in sent:
                    break
                start = max(free[rank], sent.get(dep, 0) if dep is not None else 0)
                free[rank], sent[key] = start + work, start + until_sent
                position[rank] += 1
                progress = True
    if any(position[r] < len(queues[r]) for r in group):
        return None
    span = max(free.values())
    if span <= 0:
        return {rank: None for rank in group}
    return {rank: (span - sum(work for _, work, _ in queues[rank])) / span for rank in group}


def _pass_work(mine: Sequence[Pass], sent_at: np.ndarray, compute: Prefix
               ) -> tuple[list[float], list[float]]:
    """Each pass's compute, and its compute up to its last send: when its output left for the
    next stage. Whatever the rank does after that (host work, a tracer flush) delays it, not
    the receiver."""
    lo = np.array([p.start for p in mine], np.int64)
    hi = np.array([p.end for p in mine], np.int64)
    last = np.searchsorted(sent_at, hi, side="right") - 1
    sent = sent_at[np.maximum(last, 0)] if len(sent_at) else hi
    until = np.where((last >= 0) & (sent >= lo), sent, hi) if len(sent_at) else hi
    return compute.length(lo, hi).tolist(), compute.length(lo, until).tolist()


def _virtual_stage(p: Pass, stage: int, stages: int) -> int:
    """torch.distributed.pipelining's passes (its labels, tracer.recorder.frameworks.pipelining's
    ranges) name the global stage; annotations the rank's chunk, which is virtual stage chunk*p +
    stage (Megatron's interleaving)."""
    return p.chunk if p.source in (PassSource.RECORD_FUNCTION, PassSource.SCHEDULE) \
        else p.chunk * stages + stage


def _dependency(kind: str, microbatch: Optional[int], stage: int, stages: int
                ) -> Optional[_PassKey]:
    """The pass whose output pass (kind, microbatch, virtual stage) needs, or None."""
    if kind == "F":
        return ("F", microbatch, stage - 1) if stage > 0 else None
    if kind == "W":
        return ("B", microbatch, stage)
    return ("B", microbatch, stage + 1) if stage < stages - 1 else ("F", microbatch, stage)
