"""Every collective API and kind with rank 1 arriving late, under the tracer (2 ranks, gloo).

Each case runs inside ``tracer.annotate(CASE)``: rank 1 sleeps, both ranks run the collective
and wait for it, then run one marker op (``aten.neg``) and hold the GIL in plain Python for a
while, so that a completion stamped by a future callback that still waits for the GIL would land
after the marker. The ``unwaited`` case launches an all-reduce nobody waits for: it completes by
its future. ``ddp:STEP`` is a DDP backward: DDP's finalize waits for the bucket's future in C++,
not in ``Work.wait()``, and then copies the result into the gradients; the all-reduce must end
before those copies. A c10d API this torch's gloo lacks (list all_to_all before 2.13) is
left out, and listed in OUT/unsupported-rank-R.json.
Usage: torchrun --nproc-per-node 2 comm_completion.py OUT"""
import json
import sys
import time

import torch
import torch.nn as nn
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

import tracer

LATE_S = 0.02          # how late rank 1 arrives at each collective
HOLD_S = 0.01          # how long each rank holds the GIL after its marker op
DDP_STEPS = 20         # the bucket's callback loses the race for the GIL in about 1 of 5


def hold_gil() -> None:
    end = time.perf_counter() + HOLD_S
    while time.perf_counter() < end:
        pass


def case(name, run) -> None:
    with tracer.annotate(name):
        if dist.get_rank() == 1:
            time.sleep(LATE_S)
        run()
        torch.neg(marker)
        hold_gil()


def c10d_cases(rank: int, world: int, t: torch.Tensor) -> dict:
    """name -> (blocking call, asynchronous call or None)."""
    peer = 1 - rank

    def zeros(n):
        return lambda: torch.zeros(n)
    return {
        "all_reduce": lambda **k: dist.all_reduce(t, **k),
        "all_gather": lambda **k: dist.all_gather([torch.zeros(256) for _ in range(world)], t,
                                                  **k),
        "all_gather_into_tensor": lambda **k: dist.all_gather_into_tensor(zeros(512)(), t, **k),
        "reduce_scatter": lambda **k: dist.reduce_scatter(torch.zeros(256), [t, t], **k),
        "reduce_scatter_tensor": lambda **k: dist.reduce_scatter_tensor(zeros(128)(), t, **k),
        "broadcast": lambda **k: dist.broadcast(t, src=1, **k),
        "reduce": lambda **k: dist.reduce(t, dst=0, **k),
        "gather": lambda **k: dist.gather(t, [torch.zeros(256) for _ in range(world)]
                                          if rank == 0 else None, dst=0, **k),
        "scatter": lambda **k: dist.scatter(t, [torch.ones(256) for _ in range(world)]
                                            if rank == 0 else None, src=0, **k),
        "all_to_all_single": lambda **k: dist.all_to_all_single(zeros(256)(), t, **k),
        "all_to_all": lambda **k: dist.all_to_all([torch.zeros(128), torch.zeros(128)],
                                                  [torch.ones(128), torch.ones(128)], **k),
        "barrier": lambda **k: dist.barrier(**k),
        "send_recv": lambda **k: (dist.isend(t, peer) if rank == 0 else dist.irecv(t, peer))
        if k else (dist.send(t, peer) if rank == 0 else dist.recv(t, peer)),
    }


def main(out: str) -> None:
    global marker
    with tracer.trace(out):
        dist.init_process_group("gloo")
        rank, world = dist.get_rank(), dist.get_world_size()
        peer = 1 - rank
        marker = torch.ones(2)
        t = torch.ones(256)                                           # 1 KiB of f32
        group = dist.group.WORLD
        calls = c10d_cases(rank, world, t)
        with tracer.annotate("probe"):        # gloo has list all_to_all only from torch 2.13
            try:
                calls["all_to_all"]()
            except RuntimeError as error:     # raised on each rank before it communicates
                assert "does not support alltoall" in str(error), error
                del calls["all_to_all"]
        with open(f"{out}/unsupported-rank-{rank}.json", "w") as fh:
            json.dump(sorted(set(c10d_cases(rank, world, t)) - set(calls)), fh)
        for name, call in calls.items():
            case("sync:" + name, call)
            case("async:" + name, lambda call=call: call(async_op=True).wait())
        case("async:batch_isend_irecv", lambda: [w.wait() for w in dist.batch_isend_irecv(
            [dist.P2POp(dist.isend, t, peer), dist.P2POp(dist.irecv, torch.zeros(256), peer)])])

        def coalesced_all_reduce():
            with dist._coalescing_manager(group, async_ops=True) as manager:
                dist.all_reduce(t)
                dist.all_reduce(torch.ones(8))
            manager.wait()

        def coalesced_reduce_scatter():
            with dist._coalescing_manager(group):
                dist.reduce_scatter_tensor(torch.zeros(128), t)
                dist.reduce_scatter_tensor(torch.zeros(4), torch.ones(8))
        case("coalesced:all_reduce", coalesced_all_reduce)
        case("coalesced:reduce_scatter_tensor", coalesced_reduce_scatter)
        case("functional:all_reduce", lambda: funcol.wait_tensor(funcol.all_reduce(t, "sum",
                                                                                    group)))
        case("functional:all_gather",
             lambda: funcol.wait_tensor(funcol.all_gather_tensor(t, 0, group)))
        case("functional:reduce_scatter",
             lambda: funcol.wait_tensor(funcol.reduce_scatter_tensor(t, "sum", 0, group)))
        case("functional:consumed", lambda: funcol.all_reduce(t, "sum", group) * 1)
        mesh = init_device_mesh("cpu", (world,))
        local = torch.ones(4, 8)
        for name, src, dst in (("shard_to_replicate", Shard(0), Replicate()),
                               ("partial_to_replicate", Partial(), Replicate()),
                               ("partial_to_shard", Partial(), Shard(0))):
            case("dtensor:" + name, lambda src=src, dst=dst: DTensor.from_local(
                local, mesh, [src]).redistribute(mesh, [dst]).to_local() * 1)
        model = nn.parallel.DistributedDataParallel(nn.Linear(8, 2))
        for step in range(DDP_STEPS):
            case(f"ddp:{step}", lambda: model(torch.ones(4, 8)).sum().backward())
        with tracer.annotate("unwaited:all_reduce"):
            if rank == 1:
                time.sleep(LATE_S)
            dist.all_reduce(t, async_op=True)
            torch.neg(marker)
            hold_gil()
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
