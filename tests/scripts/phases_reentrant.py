"""Reentrant activation checkpointing (``use_reentrant=True``) under DDP, traced (2 ranks, gloo;
docs/phases.md): a model whose forward checkpoints each of its two blocks, two iterations, each
an annotated section ("reentrant", iteration i) holding a forward and a backward. The checkpoint
Function's backward replays each block (recompute) and runs a backward of its own through the
replay (backward), DDP's bucket all-reduce at the end (grad_sync).

A dispatch mode of the script's own (compiled_counter.py) under the recorder counts per section
("reentrant/i") the ops that ran and the collectives: OUT/counts-<rank>.json.
Usage: torchrun --nproc-per-node 2 phases_reentrant.py OUT"""
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint

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
            x = checkpoint(block, x, use_reentrant=True)
        return self.out(x)


out = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
with tracer.trace(f"{out}/trace"):
    counter = CompiledCounter().install_below()
    model = DDP(Net())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i in range(2):
        x = torch.randn(4, 8)
        with tracer.annotate("reentrant", iteration=i):
            counter.section = f"reentrant/{i}"
            model(x).sum().backward()
            counter.section = None
        opt.step()
        opt.zero_grad()
counter.dump(f"{out}/counts-{rank}.json")
dist.destroy_process_group()
