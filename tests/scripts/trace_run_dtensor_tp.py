"""Tensor parallelism with DTensor (ColwiseParallel + RowwiseParallel MLP), gloo on CPU.

Unaware of paratrace: under trace-run its all-reduces come from DTensor's redistribution.
"""
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                               parallelize_module)

from tp_mlp import MLP

dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (dist.get_world_size(),))
torch.manual_seed(0)
model = parallelize_module(MLP(), mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(2):
    x = torch.randn(4, 16)
    loss = model(x).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    print(f"rank {dist.get_rank()} step {step} loss {loss.item():.4f}", flush=True)
dist.destroy_process_group()
