"""2 ranks; at their third collective rank 1 broadcasts where rank 0 all-reduces: a hang."""
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
for i in range(3):
    t = torch.ones(1024)
    if i == 2 and rank == 1:
        dist.broadcast(t, src=0)         # the mismatch
    else:
        dist.all_reduce(t)
dist.destroy_process_group()
