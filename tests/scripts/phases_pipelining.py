"""torch.distributed.pipelining's schedules under the tracer, every one in one launch (2 ranks,
gloo, a tiny model of Linear stages): GPipe, 1F1B, interleaved 1F1B (2 stages per rank),
interleaved zero bubble (1 stage per rank: ZB-H1) and ZB-V (2 stages per rank), each in its own
step, with a torch.randn outside the schedule in every step. Each rank writes the compute
actions each schedule planned for it (``pipeline_order``) to OUT/plans-<rank>.json, and whether
the tracer put torch's methods back after the trace. Without an OUT argument the schedules run
untraced.
Usage: torchrun --nproc-per-node 2 phases_pipelining.py [OUT]"""
import contextlib
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn

import tracer

# Rank 0 imports torch.distributed.pipelining before the trace starts, rank 1 only inside it:
# the recorder patches it either way (at the start, or when it is imported)
if os.environ.get("RANK") == "0":
    import torch.distributed.pipelining  # noqa: F401

M = 4          # micro-batches
WIDTH = 8


def stages(rank: int, world: int, indices) -> list:
    """One PipelineStage per global stage index in ``indices``, each a Linear + ReLU."""
    from torch.distributed.pipelining import PipelineStage
    total = world * len(indices)
    out = []
    for index in indices:
        torch.manual_seed(index)
        module = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU())
        out.append(PipelineStage(module, index, total, torch.device("cpu")))
    return out


def loss_fn(output, target):
    return ((output - target) ** 2).mean()


def run(name: str, schedule, rank: int) -> None:
    noise = torch.randn(M * 2, WIDTH)            # outside the schedule: not a pass
    x, target = torch.randn(M * 2, WIDTH), torch.randn(M * 2, WIDTH)
    with tracer.annotate(name):
        if rank == 0:
            schedule.step(x + noise, target=target)
        else:
            schedule.step(target=target)


def unrunnable() -> frozenset:
    """Schedules this torch's own pipelining cannot run on gloo, with or without paratrace: the
    zero-bubble ones (interleaved zero bubble with a stage per rank, ZB-V) fail their P2P
    handshake ("Pair is not connected") until torch rewrote it (2.13:
    PipelineScheduleMulti._initialize_pp_stages)."""
    from torch.distributed.pipelining.schedules import PipelineScheduleMulti
    return frozenset() if hasattr(PipelineScheduleMulti, "_initialize_pp_stages") \
        else frozenset({"zero-bubble", "zbv"})


UNRUNNABLE = unrunnable()


def plan(schedule, rank: int) -> list:
    """The schedule's own plan for this rank: (kind, microbatch, stage) of its compute actions
    (zero bubble's I, the backward of the inputs, is a B)."""
    kinds = {"F": "F", "B": "B", "I": "B", "W": "W"}
    def code(action) -> str:     # "F"...: the enum's value, or its str() where the value is
        kind = action.computation_type      # a number (torch 2.10)
        return kind.value if isinstance(kind.value, str) else str(kind)
    return [(kinds[code(a)], a.microbatch_index, a.stage_index)
            for a in schedule.pipeline_order[rank]
            if a is not None and code(a) in kinds]


def main(out) -> None:
    from torch.distributed.pipelining import (Schedule1F1B, ScheduleGPipe,
                                              ScheduleInterleaved1F1B,
                                              ScheduleInterleavedZeroBubble, ScheduleZBVZeroBubble)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    cases = [
        ("gpipe", lambda: ScheduleGPipe(stages(rank, world, [rank])[0], M, loss_fn=loss_fn)),
        ("1f1b", lambda: Schedule1F1B(stages(rank, world, [rank])[0], M, loss_fn=loss_fn)),
        ("interleaved", lambda: ScheduleInterleaved1F1B(
            stages(rank, world, [rank, rank + world]), M, loss_fn=loss_fn)),
        ("zero-bubble", lambda: ScheduleInterleavedZeroBubble(
            stages(rank, world, [rank]), M, loss_fn=loss_fn)),
        ("zbv", lambda: ScheduleZBVZeroBubble(
            stages(rank, world, [rank, 2 * world - 1 - rank]), M, loss_fn=loss_fn)),
    ]
    plans = {}
    for name, make in cases:
        if name in UNRUNNABLE:
            tracer.step()                  # the step is kept, empty: the others keep their number
            continue
        schedule = make()
        plans[name] = plan(schedule, rank)
        tracer.step()
        run(name, schedule, rank)
    tracer.step()
    dist.destroy_process_group()
    if out:
        with open(f"{out}/plans-{rank}.json", "w") as fh:
            json.dump(plans, fh)


def restored(out) -> None:
    """Whether torch's pipelining methods are its own again once the trace ended."""
    from torch.distributed.pipelining import schedules, stage
    patched = [f for f in (stage._PipelineStageBase.forward_one_chunk,
                           stage._PipelineStageBase.get_bwd_send_ops,
                           schedules.PipelineScheduleSingle.step, schedules._batch_p2p)
               if hasattr(f, "__wrapped__")]           # functools.wraps marks the tracer's
    patched += [type(f).__name__ for f in sys.meta_path if type(f).__module__.startswith("tracer")]
    with open(f"{out}/restored-{os.environ['RANK']}.json", "w") as fh:
        json.dump([getattr(f, "__qualname__", f) for f in patched], fh)


if __name__ == "__main__":
    torch.manual_seed(0)
    OUT = sys.argv[1] if len(sys.argv) > 1 else None
    with tracer.trace(OUT) if OUT else contextlib.nullcontext():
        main(OUT)
    if OUT:
        restored(OUT)
