"""FSDP2 (``fully_shard`` on each Linear and on the root) training of a tiny MLP with AdamW (2
ranks, gloo), unaware of paratrace, for tests/integration/test_memory_frameworks.py: after step
1's ``optimizer.step()`` (the second iteration; trace-run's steps advance at each optimizer
step) rank 0 writes an independent count of what it holds, by walking the objects
(memory_count.py): its parameters' local shards, their gradients' and the optimizer state's,
and the bytes each Linear's parameters take unsharded.
Usage: torchrun --nproc-per-node 2 memory_fsdp2.py OUT.json"""
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard

from memory_count import full_bytes, mlp, train_and_count, write

out = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
model = mlp()
for layer in model:
    if isinstance(layer, nn.Linear):
        fully_shard(layer)
fully_shard(model)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
count = train_and_count(model, optimizer, rank, lambda root: {"unsharded": [
    full_bytes(layer) for layer in root if isinstance(layer, nn.Linear)]})
if rank == 0:
    write(out, count)
dist.destroy_process_group()
