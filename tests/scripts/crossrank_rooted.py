"""Rooted collectives on gloo, sized by the script's own tensors: DTensor's parallelize_module
scatters the sharded weights from group rank 0 and broadcasts the replicated bias; then a gather
and a reduce to rank 1, once with the root last to arrive and once with it first.

Rank 0 writes what nccl-tests would call each kind's size, summed over the script's calls, to the
JSON file named by its one argument: scatter, the root's full tensors; gather, the n chunks the
root receives; broadcast and reduce, the tensor."""
import json
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                               parallelize_module)

from tp_mlp import MLP

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
mesh = init_device_mesh("cpu", (world,))
torch.manual_seed(0)
mlp = MLP()
nbytes = {name: p.numel() * p.element_size() for name, p in mlp.named_parameters()}
# ColwiseParallel shards up's weight and bias, RowwiseParallel down's weight; down's bias is
# replicated: a scatter each, from the full tensor, and one broadcast
expected = {"scatter": nbytes["up.weight"] + nbytes["up.bias"] + nbytes["down.weight"],
            "broadcast": nbytes["down.bias"], "gather": 0, "reduce": 0}
model = parallelize_module(mlp, mesh, {"up": ColwiseParallel(), "down": RowwiseParallel()})

ROOT = 1
chunk = torch.full((256,), float(rank))
for root_last in (True, False):
    # planted arrival orders: the root 0.3 s after the others, then 0.3 s before them
    if (rank == ROOT) == root_last:
        time.sleep(0.3)
    gathered = [torch.empty_like(chunk) for _ in range(world)] if rank == ROOT else None
    dist.gather(chunk, gathered, dst=ROOT)
    expected["gather"] += world * chunk.numel() * chunk.element_size()
    if (rank == ROOT) == root_last:
        time.sleep(0.3)
    total = chunk.clone()
    dist.reduce(total, dst=ROOT)
    expected["reduce"] += total.numel() * total.element_size()
loss = model(torch.randn(4, 16)).pow(2).mean()
loss.backward()
if rank == 0:
    with open(sys.argv[1], "w") as f:
        json.dump(expected, f)
dist.destroy_process_group()
