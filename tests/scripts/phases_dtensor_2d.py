"""2-D DTensor training under the tracer (4 ranks, gloo): a DeviceMesh (dp=2, tp=2), an MLP
with ColwiseParallel / RowwiseParallel over tp and FSDP2 (fully_shard) over dp; forward,
backward and an SGD step, each in its own annotation. torch's CommDebugMode, entered before the
trace (below paratrace's mode, so that paratrace sees every DTensor op first), counts the
collectives of each section in the same run: OUT/comm-debug-<rank>.json.
Usage: torchrun --nproc-per-node 4 phases_dtensor_2d.py OUT"""
import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.debug import CommDebugMode
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                               parallelize_module)

import tracer
from comm_sections import Sections
from tp_mlp import MLP

out = sys.argv[1]
dist.init_process_group("gloo")
torch.manual_seed(0)
mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
model = parallelize_module(MLP(), mesh["tp"], {"up": ColwiseParallel(),
                                               "down": RowwiseParallel()})
for layer in (model.up, model.down):
    fully_shard(layer, mesh=mesh["dp"])
fully_shard(model, mesh=mesh["dp"])
opt = torch.optim.SGD(model.parameters(), lr=0.1)
# the input needs a gradient (as a previous layer's output would): ColwiseParallel all-reduces
# it in backward
x = torch.randn(4, 16, requires_grad=True)
with CommDebugMode() as mode, tracer.trace(out):
    sections = Sections(mode)
    with tracer.annotate("fwd"):
        loss = model(x).sum()
    sections.done("fwd")
    with tracer.annotate("bwd"):
        loss.backward()
    sections.done("bwd")
    with tracer.annotate("opt"):
        opt.step()
    sections.done("opt")
with open(f"{out}/comm-debug-{dist.get_rank()}.json", "w") as fh:
    json.dump(sections.debug, fh)
dist.destroy_process_group()
