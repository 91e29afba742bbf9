"""Every collective API under the tracer (2 ranks, gloo), with torch's CommDebugMode counting the
DTensor section in the same run. Usage: torchrun --nproc-per-node 2 tracer_collectives.py OUT"""
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

import tracer

out = sys.argv[1]
with tracer.trace(out):
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    peer = 1 - rank
    t = torch.ones(256)                                                  # 1 KiB of f32
    with tracer.annotate("c10d"):
        dist.all_reduce(t)
        dist.all_reduce(t, async_op=True).wait()
        dist.all_gather([torch.zeros(256) for _ in range(world)], t)
        dist.all_gather_into_tensor(torch.zeros(256 * world), t)
        dist.reduce_scatter_tensor(torch.zeros(256 // world), t)
        dist.broadcast(t, src=1)
        dist.reduce(t, dst=0)
        dist.gather(t, [torch.zeros(256) for _ in range(world)] if rank == 0 else None, dst=0)
        dist.scatter(t, [torch.ones(256) for _ in range(world)] if rank == 0 else None, src=0)
        dist.all_to_all_single(torch.zeros(256), t)
        dist.barrier()
        if rank == 0:
            dist.send(t, 1)
        else:
            dist.recv(t, 0)
        for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, t, peer),
                                            dist.P2POp(dist.irecv, torch.zeros(256), peer)]):
            work.wait()
    with tracer.annotate("functional"):
        y = funcol.all_reduce(t, "sum", dist.group.WORLD)
        y = y * 2                                   # consuming the result waits for it
        z = funcol.wait_tensor(funcol.all_gather_tensor(t, 0, dist.group.WORLD))
        funcol.wait_tensor(funcol.reduce_scatter_tensor(t, "sum", 0, dist.group.WORLD))

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)

    class MLP(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.up = torch.nn.Linear(16, 32)
            self.down = torch.nn.Linear(32, 16)

        def forward(self, x):
            return self.down(torch.relu(self.up(x)))

    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (world,))
    model = parallelize_module(MLP(), mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
    with tracer.annotate("dtensor"), CommDebugMode() as comm_mode:
        model(torch.randn(4, 16)).sum().backward()
    counts = {str(k): v for k, v in comm_mode.get_comm_counts().items()}
    with open(os.path.join(out, f"commdebug-{rank}.json"), "w") as fh:
        json.dump(counts, fh)
    dist.destroy_process_group()
