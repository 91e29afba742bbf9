"""3 ranks, 4 all-reduces; rank 1 sleeps before each: the straggler the others wait for."""
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
for _ in range(4):
    if rank == 1:
        time.sleep(0.3)                  # rank 1 is late
    t = torch.ones(4096)
    dist.all_reduce(t)
dist.destroy_process_group()
