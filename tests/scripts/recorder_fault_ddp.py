"""DDP on two gloo ranks, four steps, trained untraced and then traced from the same seed; in
the traced run, rank 1's recorder fails at step 2 as it records a gradient all-reduce (a fault
planted in comm.py's launch). Each rank writes OUT/losses-<rank>.json: both runs' losses and
whether their final parameters are equal, bit for bit (test_recorder_fault_runs.py)."""
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import tracer

out = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()


def train(session=None) -> tuple:
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(),
                                    torch.nn.Linear(16, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = torch.randn(4, 8, 16, generator=torch.Generator().manual_seed(rank))
    losses = []
    for step in range(4):
        if session is not None and step == 2 and rank == 1:
            def fails(*args, **kwargs):
                raise RuntimeError("planted in comm.launch")
            session._comm.launch = fails
        loss = model(data[step]).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, [p.detach().clone() for p in model.parameters()]


untraced, params = train()
with tracer.trace(out) as session:
    traced, traced_params = train(session)
same = all(torch.equal(a, b) for a, b in zip(params, traced_params))
with open(os.path.join(out, f"losses-{rank}.json"), "w") as fh:
    json.dump({"untraced": untraced, "traced": traced, "same_params": same}, fh)
dist.destroy_process_group()
