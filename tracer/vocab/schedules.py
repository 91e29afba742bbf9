"""Pipeline schedules as pure functions: the ordered F/B/W actions of one pipeline rank.

The passes the labels name (:mod:`.labels`), in the order each schedule runs them. The reference
GPT's executor (sample_runs.parallel.pipeline_parallel) runs any such list, and trace-whatif
(viz.whatif.reference_gpt.plan) predicts a target's step from the same orders; keeping the order
apart makes each schedule a few lines that can be checked against the papers without running a
model.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Action:
    """One pass of one micro-batch through one model chunk of this rank.

    kind: "F" forward, "B" backward (input and, unless deferred, weight gradients),
    "W" deferred weight gradients (zero bubble).
    """

    kind: str
    microbatch: int
    chunk: int = 0

    def __str__(self) -> str:
        return f"{self.kind}{self.microbatch}" + (f".{self.chunk}" if self.chunk else "")


def gpipe(*, stages: int, rank: int, microbatches: int, chunks: int = 1) -> list[Action]:
    """GPipe (Huang et al. 2019): all forwards, then all backwards."""
    m = range(microbatches)
    return [Action("F", i) for i in m] + [Action("B", i) for i in m]


def one_f_one_b(*, stages: int, rank: int, microbatches: int, chunks: int = 1) -> list[Action]:
    """1F1B (PipeDream-Flush, Narayanan et al. 2021): stage r runs min(p-r-1, m) warmup
    forwards, then alternates one forward and one backward, then drains the backwards; at
    most p micro-batches are in flight."""
    warmup = min(stages - rank - 1, microbatches)
    order = [Action("F", i) for i in range(warmup)]
    for i in range(microbatches - warmup):
        order += [Action("F", warmup + i), Action("B", i)]
    return order + [Action("B", i) for i in range(microbatches - warmup, microbatches)]


def interleaved(*, stages: int, rank: int, microbatches: int, chunks: int) -> list[Action]:
    """Megatron's interleaved 1F1B (Narayanan et al. 2021): rank r holds v chunks (virtual
    stages r, r+p, ...); micro-batches go through the chunks in groups of p; the warmup is
    2(p-r-1) + (v-1)p forwards (everything when m == p). Requires m % p == 0."""
    p, v, m = stages, chunks, microbatches
    total = m * v

    def action(kind: str, k: int) -> Action:
        in_group = k % (p * v)
        chunk = in_group // p
        microbatch = (k // (p * v)) * p + k % p
        return Action(kind, microbatch, chunk if kind == "F" else v - 1 - chunk)

    warmup = total if m == p else min(2 * (p - rank - 1) + (v - 1) * p, total)
    order = [action("F", k) for k in range(warmup)]
    for k in range(total - warmup):
        order += [action("F", warmup + k), action("B", k)]
    return order + [action("B", k) for k in range(total - warmup, total)]


def zb_h1(*, stages: int, rank: int, microbatches: int, chunks: int = 1) -> list[Action]:
    """ZB-H1 (Qi et al. 2023): the 1F1B order of F and B, with the backward split into B
    (input gradient, sent upstream at once) and W (weight gradient). Stage r keeps up to r
    W passes pending, so later stages, idle at the end of 1F1B, fill that time with W while
    earlier stages get their gradients sooner. Stage r then holds at most p micro-batches'
    activations, the same peak (stage 0's) as 1F1B."""
    order: list[Action] = []
    pending: list[int] = []
    for action in one_f_one_b(stages=stages, rank=rank, microbatches=microbatches):
        order.append(action)
        if action.kind == "B":
            pending.append(action.microbatch)
            if len(pending) > rank:
                order.append(Action("W", pending.pop(0)))
    return order + [Action("W", i) for i in pending]


SCHEDULES: dict[str, Callable[..., list[Action]]] = {
    "gpipe": gpipe,
    "1f1b": one_f_one_b,
    "interleaved": interleaved,
    "zb-h1": zb_h1,
}


def schedule_actions(name: str, *, stages: int, rank: int, microbatches: int,
                     chunks: int = 1) -> list[Action]:
    """The actions of pipeline rank ``rank`` for schedule ``name``."""
    return SCHEDULES[name](stages=stages, rank=rank, microbatches=microbatches, chunks=chunks)
