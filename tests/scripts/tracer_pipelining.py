"""torch.distributed.pipelining Schedule1F1B under the tracer: 2 stages, 4 micro-batches,
2 steps. Usage: torchrun --nproc-per-node 2 tracer_pipelining.py OUT"""
import sys

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, Schedule1F1B

import tracer

out = sys.argv[1]
with tracer.trace(out):
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    stage_module = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh())
    stage = PipelineStage(stage_module, rank, world, torch.device("cpu"))
    loss_fn = lambda output, target: ((output - target) ** 2).mean()  # noqa: E731
    schedule = Schedule1F1B(stage, n_microbatches=4, loss_fn=loss_fn)
    optimizer = torch.optim.SGD(stage_module.parameters(), lr=0.01)
    for _ in range(2):
        x, target = torch.randn(8, 8), torch.randn(8, 8)
        if rank == 0:
            schedule.step(x)
        else:
            schedule.step(target=target, losses=[])
        optimizer.step()
        optimizer.zero_grad()
    dist.destroy_process_group()
