"""torch.compile under the tracer (2 ranks, gloo), one launch, two traces:

- OUT/compiled (the default): the same tiny model compiled with the inductor backend and with
  Dynamo's eager backend, two training steps each; its forward all-reduces a statistic of the
  input with a functional collective, inside the compiled graph;
- OUT/eager (``compiled="eager"``): the inductor-compiled model again, recorded op by op.

Dynamo's counters around each part (graphs compiled, inductor's extern kernel calls) go to
OUT/counters-<rank>.json, and the warnings the run raised to OUT/warnings-<rank>.json.
Usage: torchrun --nproc-per-node 2 phases_compile.py OUT"""
import json
import sys
import warnings

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn as nn
from torch._dynamo.utils import counters

import tracer


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 2)

    def forward(self, x):
        norm = funcol.all_reduce(x.detach().pow(2).sum(), "sum", dist.group.WORLD)
        return self.b(torch.relu(self.a(x))) / (1 + norm)


def snapshot() -> dict:
    return {"graphs": counters["stats"]["unique_graphs"],
            "extern_calls": counters["inductor"]["extern_calls"]}


def train(model, label: str, steps: int = 2) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i in range(steps):
        with tracer.annotate(label, iteration=i):
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
            opt.zero_grad()


out = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
numbers: dict = {"start": snapshot()}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with tracer.trace(f"{out}/compiled"):
        train(torch.compile(Net(), backend="inductor"), "inductor")
        numbers["inductor"] = snapshot()
        train(torch.compile(Net(), backend="eager"), "eager-backend")
        numbers["eager-backend"] = snapshot()
    with tracer.trace(f"{out}/eager", compiled="eager"):
        train(torch.compile(Net(), backend="inductor"), "inductor")
        numbers["traced-eagerly"] = snapshot()
with open(f"{out}/counters-{rank}.json", "w") as fh:
    json.dump(numbers, fh)
with open(f"{out}/warnings-{rank}.json", "w") as fh:
    json.dump([f"{w.category.__name__}: {w.message}" for w in caught], fh)
dist.destroy_process_group()
