"""The replayed pipeline bubble: what the bubble would be if communication were free.

For each pipeline group and step, the measured passes run again in the same order, each taking
the compute it measured: a pass starts once its rank is free and the pass it depends on has sent
its output (shared/ORACLES.md's dependency simulation, with measured times). The gap between the
measured bubble and this one is what communication costs; the gap between this one and the
papers' theory is stage imbalance and pass-time variance (docs/metrics.md).

One replay per (pipeline group, step) serves every rank of the group; each pass costs two
prefix-sum lookups of its rank's compute, so a step replays in O(passes log n).
"""
from __future__ import annotations

import bisect
from typing import Callable, Optional

from .timeline import Pass, Timeline


def replayed_bubbles(timeline: Timeline, passes: dict, sends: dict,
                     busy: Callable[[int, int, int], int]) -> dict:
    """(rank, step) -> replayed bubble fraction (None where passes do not form a schedule).

    ``passes``: (rank, step) -> passes in start order; ``sends``: (rank, step) -> sorted send
    starts; ``busy(rank, lo, hi)``: the rank's compute inside [lo, hi)."""
    out = {}
    done: dict = {}
    for rank, lane in timeline.ranks.items():
        group = tuple(r for r in lane.pipeline_group if r in timeline.ranks)
        if len(group) < 2:
            continue
        for step in lane.steps:
            if (rank, step) not in passes:
                continue
            key = (group, step)
            if key not in done:
                done[key] = _replay(group, step, passes, sends, busy)
            out[(rank, step)] = done[key].get(rank) if done[key] is not None else None
    return out


def _replay(group: tuple, step: int, passes: dict, sends: dict, busy) -> Optional[dict]:
    """rank -> replayed bubble fraction of one group's step, or None if it cannot replay."""
    queues = {}
    for stage, rank in enumerate(group):
        mine = passes.get((rank, step), [])
        if any(p.microbatch is None for p in mine):
            return None
        sent_at = sends.get((rank, step), [])
        queues[rank] = [((p.kind, p.microbatch, _virtual_stage(p, stage, len(group))),
                         busy(rank, p.start, p.end), _until_sent(busy, rank, p, sent_at))
                        for p in mine]
    stages = 1 + max((key[2] for q in queues.values() for key, _, _ in q), default=0)
    stages = len(group) * -(-stages // len(group))     # whole chunks on every stage
    sent: dict = {}
    free = {rank: 0 for rank in group}
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
                start = max(free[rank], sent.get(dep, 0))
                free[rank], sent[key] = start + work, start + until_sent
                position[rank] += 1
                progress = True
    if any(position[r] < len(queues[r]) for r in group):
        return None
    span = max(free.values())
    if span <= 0:
        return {rank: None for rank in group}
    return {rank: (span - sum(work for _, work, _ in queues[rank])) / span for rank in group}


def _until_sent(busy, rank: int, p: Pass, sent_at: list) -> int:
    """Compute of pass ``p`` up to its last send: when its output left for the next stage.
    Whatever the rank does after that (host work, a tracer flush) delays it, not the receiver."""
    i = bisect.bisect_right(sent_at, p.end)
    last = sent_at[i - 1] if i and sent_at[i - 1] >= p.start else p.end
    return busy(rank, p.start, last)


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
