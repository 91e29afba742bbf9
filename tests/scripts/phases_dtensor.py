"""DTensor ops under the tracer (2 ranks, gloo), every 2-rank case in one launch:

- ``mm``: ``a @ b`` with a (8, 4) and b (4, 6) both Shard(0): DTensor all-gathers b inside the
  op (a redistribution paratrace's mode does not see unless DTensor dispatches under it), then
  the backward;
- ``full``: ``full_tensor()`` in a loss computed outside modules with grad on (its all-gather
  runs inside an autograd Function's forward, with grad mode off), and under no_grad.

torch's CommDebugMode is entered before the trace (below paratrace's mode) and counts each
section's collectives: OUT/comm-debug-<rank>.json.
Usage: torchrun --nproc-per-node 2 phases_dtensor.py OUT"""
import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor
from torch.distributed.tensor.debug import CommDebugMode

import tracer
from comm_sections import Sections


out = sys.argv[1]
dist.init_process_group("gloo")
torch.manual_seed(0)
mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("tp",))
a = distribute_tensor(torch.randn(8, 4), mesh, [Shard(0)]).requires_grad_()
b = distribute_tensor(torch.randn(4, 6), mesh, [Shard(0)]).requires_grad_()
with CommDebugMode() as mode, tracer.trace(out):
    sections = Sections(mode)
    with tracer.annotate("mm-forward"):
        c = a @ b                                         # all-gathers b inside the op
    sections.done("mm-forward")
    with tracer.annotate("mm-backward"):
        c.sum().backward()
    sections.done("mm-backward")
    with tracer.annotate("full"):
        loss = (c.full_tensor() * 2).sum()                # the loss: forward
    sections.done("full")
    with tracer.annotate("full-no-grad"), torch.no_grad():
        c.full_tensor()                                   # a metric: other
    sections.done("full-no-grad")
with open(f"{out}/comm-debug-{dist.get_rank()}.json", "w") as fh:
    json.dump(sections.debug, fh)
dist.destroy_process_group()
