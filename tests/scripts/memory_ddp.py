"""DDP training of a tiny MLP with AdamW (2 ranks, gloo), unaware of paratrace, for
tests/integration/test_memory_frameworks.py: after step 1's ``optimizer.step()`` (the second
iteration; trace-run's steps advance at each optimizer step) rank 0 writes an independent count
of what it holds, by walking the objects (memory_count.py), and the sizes of DDP's gradient
buckets as DDP reports them (its logging data).
Usage: torchrun --nproc-per-node 2 memory_ddp.py OUT.json [--bucket-view]
(--bucket-view: ``gradient_as_bucket_view=True``, the gradients are views of the buckets)"""
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from memory_count import mlp, train_and_count, write

out, bucket_view = sys.argv[1], "--bucket-view" in sys.argv[2:]
dist.init_process_group("gloo")
rank = dist.get_rank()
model = DDP(mlp(), gradient_as_bucket_view=bucket_view)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
count = train_and_count(model, optimizer, rank, lambda ddp: {"buckets": [
    int(b) for b in str(ddp._get_ddp_logging_data().get("bucket_sizes", "")).split(",")
    if b.strip()]})
if rank == 0:
    write(out, count)
dist.destroy_process_group()
