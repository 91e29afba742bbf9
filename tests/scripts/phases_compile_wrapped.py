"""torch.compile as people combine it with wrappers and parent modules, under the recorder
(2 ranks, gloo; docs/phases.md#torchcompile). One trace, OUT/trace; one annotated section per
case, three iterations each (iteration 0 compiles while recording; 1 and 2 run warm), each a
forward and a backward (the AdamW step runs after the section):

- compile-ddp: ``torch.compile(DDP(Net()))`` (Dynamo's DDPOptimizer path);
- ddp-compile: ``DDP(torch.compile(Net()))`` (the same path, the compiled module called from
  DDP's forward);
- submodule: an eager ``Parent`` whose ``child`` is ``torch.compile(Net())``: the module hooks
  run eagerly inside the compiled module's call (nanoGPT's shape under DDP);
- method: ``Net().compile()``;
- fsdp: ``fully_shard`` over ``torch.compile``'d blocks, then over the root (torchtitan's);
- graph-break: ``torch.compile(Branchy())``, whose forward branches on a tensor's value.

A dispatch mode of the script's own (compiled_counter.py) runs compiled under the recorder and
counts, per section and iteration ("label/i"), the ops that ran, the ops it saw while Dynamo
compiled, and the collectives: OUT/counts-<rank>.json. Dynamo's count of graphs compiled per
section and iteration: OUT/graphs-<rank>.json.
Usage: torchrun --nproc-per-node 2 phases_compile_wrapped.py OUT"""
import json
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch._dynamo.utils import counters
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

import tracer
from compiled_counter import CompiledCounter


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln, self.fc = nn.LayerNorm(16), nn.Linear(16, 16)

    def forward(self, x):
        return x + torch.tanh(self.fc(self.ln(x)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp, self.out = nn.Linear(8, 16), nn.Linear(16, 2)
        self.blocks = nn.ModuleList([Block(), Block()])

    def forward(self, x):
        x = self.inp(x)
        for block in self.blocks:
            x = block(x)
        return self.out(x)


class Parent(nn.Module):
    def __init__(self):
        super().__init__()
        self.child, self.head = torch.compile(Net()), nn.Linear(2, 2)

    def forward(self, x):
        return self.head(torch.relu(self.child(x)))


class Branchy(Net):
    def forward(self, x):
        x = self.inp(x)
        if x.sum() > 0:          # a tensor's value decides: Dynamo breaks the graph here
            x = x * 2
        for block in self.blocks:
            x = block(x)
        return self.out(x)


def sharded() -> nn.Module:
    net = Net()
    for i, block in enumerate(net.blocks):
        net.blocks[i] = torch.compile(block)
        fully_shard(net.blocks[i])
    fully_shard(net)
    return net


def method() -> nn.Module:
    net = Net()
    net.compile()
    return net


CASES = {"compile-ddp": lambda: torch.compile(DDP(Net())),
         "ddp-compile": lambda: DDP(torch.compile(Net())),
         "submodule": Parent, "method": method, "fsdp": sharded,
         "graph-break": lambda: torch.compile(Branchy())}

out = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
graphs: dict = {}
with tracer.trace(f"{out}/trace"):
    counter = CompiledCounter().install_below()
    for label, make in CASES.items():
        torch._dynamo.reset()     # each case compiles in its own first iteration
        torch.manual_seed(0)
        model = make()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        for i in range(3):
            x = torch.randn(4, 8)
            before = counters["stats"]["unique_graphs"]
            with tracer.annotate(label, iteration=i):
                counter.section = f"{label}/{i}"
                model(x).sum().backward()
                counter.section = None
            graphs[f"{label}/{i}"] = counters["stats"]["unique_graphs"] - before
            opt.step()
            opt.zero_grad()
counter.dump(f"{out}/counts-{rank}.json")
with open(f"{out}/graphs-{rank}.json", "w") as fh:
    json.dump(graphs, fh)
dist.destroy_process_group()
