"""Two-stage pipeline with torch.distributed.pipelining (Schedule1F1B, 4 micro-batches), gloo.

Unaware of paratrace: under trace-run its sends and receives are recorded per stage.
"""
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
layers = [nn.Sequential(nn.Linear(8, 8), nn.ReLU()) for _ in range(world)]
stage_module = layers[rank]
stage = PipelineStage(stage_module, rank, world, torch.device("cpu"))
schedule = Schedule1F1B(stage, n_microbatches=4, loss_fn=lambda out, y: (out - y).pow(2).mean())
opt = torch.optim.SGD(stage_module.parameters(), lr=0.1)
for step in range(2):
    x, y = torch.randn(8, 8), torch.randn(8, 8)
    if rank == 0:
        schedule.step(x)
    elif rank == world - 1:
        losses = []
        schedule.step(target=y, losses=losses)
        print(f"step {step} loss {sum(l.item() for l in losses) / len(losses):.4f}", flush=True)
    else:
        schedule.step()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
