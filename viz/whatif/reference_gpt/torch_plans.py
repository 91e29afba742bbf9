"""torch.distributed.pipelining's own plans for its interleaved schedules, restated without
torch (viz never imports it): the order of compute actions ScheduleInterleaved1F1B and
ScheduleInterleavedZeroBubble give each rank (torch 2.13's ``_get_warmup_ops`` and
``_get_1f1b_rank_ops``, BSD licence), so a recording of those schedules is predicted in the
order torch would run. GPipe and 1F1B give the same order as the reference GPT's
(tracer.vocab.schedules). tests/unit/test_whatif_plans.py checks every order against
torch's ``pipeline_order``.
"""
from __future__ import annotations

from typing import NamedTuple


class TorchAction(NamedTuple):
    """A compute action of a rank: kind F, B (full, or input-only under zero bubble) or W,
    micro-batch, and the rank's chunk (torch's stage index // pp in its looped placement)."""

    kind: str
    microbatch: int
    chunk: int


def _rounds(pp: int, m: int) -> int:
    """Micro-batches per round: torch runs m // max(1, m // pp) per round."""
    return m // max(1, m // pp)


def torch_order(schedule: str, *, stages: int, rank: int, microbatches: int,
                chunks: int) -> list:
    """The actions torch gives ``rank`` of ``stages`` pipeline ranks: ``schedule`` is
    "interleaved" (ScheduleInterleaved1F1B) or "zb-h1"/"interleaved-zb"
    (ScheduleInterleavedZeroBubble)."""
    zero_bubble = schedule in ("zb-h1", "interleaved-zb")
    per_round = _rounds(stages, microbatches)
    total = chunks * microbatches
    warmup = min((chunks - 1) * per_round + (1 if zero_bubble else 2) * (stages - 1 - rank),
                 total)
    fwd_bwd = total - warmup
    cooldown = total - fwd_bwd

    def forward_chunk(op: int) -> int:
        return (op // per_round) % chunks

    def backward_chunk(op: int) -> int:
        return chunks - 1 - ((op - warmup) // per_round) % chunks

    return _rank_ops(warmup, fwd_bwd, cooldown, forward_chunk, backward_chunk,
                     rank if zero_bubble else None)


def _rank_ops(warmup: int, fwd_bwd: int, cooldown: int, forward_chunk, backward_chunk,
              one_f_one_b) -> list:
    """torch's _get_1f1b_rank_ops without its no-op padding; ``one_f_one_b``: None, or under
    zero bubble the count of backwards before weight passes start."""
    taken: dict = {"F": {}, "B": {}, "W": {}}
    out: list = []
    backwards: list = []                  # the op index of every backward so far

    def act(kind: str, chunk: int) -> None:
        mb = taken[kind].get(chunk, 0)
        taken[kind][chunk] = mb + 1
        out.append(TorchAction(kind, mb, chunk))

    for op in range(warmup + fwd_bwd + cooldown):
        if op < warmup + fwd_bwd:
            act("F", forward_chunk(op))
        if op >= warmup:
            act("B", backward_chunk(op))
            backwards.append(op)
            if one_f_one_b is not None and op - warmup >= one_f_one_b:
                act("W", backward_chunk(backwards[sum(taken["W"].values())]))
    while one_f_one_b is not None and sum(taken["W"].values()) < len(backwards):
        act("W", backward_chunk(backwards[sum(taken["W"].values())]))
    return out
