"""2 ranks, 2 steps, orders that are legal and must not read as mismatches:

- P2P and a collective on the world group in different orders: rank 0 sends, then all-reduces;
  rank 1 all-reduces, then receives (a send does not move the collectives' numbering);
- two process groups over the same ranks, [0,1] twice, used in opposite orders: rank 0 reduces
  4 floats on A and then 64 on B, rank 1 starts B's first (each group is numbered apart).
"""
import torch
import torch.distributed as dist

import tracer

dist.init_process_group("gloo")
rank = dist.get_rank()
group_a = dist.new_group([0, 1])
group_b = dist.new_group([0, 1])
for _ in range(2):
    message = torch.full((8,), 1.0)
    total = torch.ones(16)
    if rank == 0:
        send = dist.isend(message, dst=1)
        dist.all_reduce(total)
        send.wait()
    else:
        dist.all_reduce(total)
        dist.recv(message, src=0)
    small, large = torch.ones(4), torch.ones(64)
    if rank == 0:
        works = [dist.all_reduce(small, group=group_a, async_op=True),
                 dist.all_reduce(large, group=group_b, async_op=True)]
    else:
        works = [dist.all_reduce(large, group=group_b, async_op=True),
                 dist.all_reduce(small, group=group_a, async_op=True)]
    for work in works:
        work.wait()
    tracer.step()
dist.destroy_process_group()
