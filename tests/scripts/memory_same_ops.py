"""The same training traced with and without memory (tests/integration/test_memory_same_ops.py):
DDP, FSDP2 (fully_shard) and non-reentrant activation checkpointing under DDP, a tiny MLP each,
AdamW, two iterations of each in an annotated section (2 ranks, gloo). The script knows nothing
of memory recording.

A dispatch mode of the script's own under the recorder (compiled_counter.py) counts per section
("ddp/i", "fsdp2/i", "checkpoint/i") the ops that ran and the collectives:
OUT/counts-<rank>.json. It sees every op torch dispatches below the recorder, so it says whether
memory recording changed what ran, apart from what the recorder wrote.
Usage: trace-run [--memory] --nproc-per-node 2 memory_same_ops.py OUT"""
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint

import tracer
from compiled_counter import CompiledCounter


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.GELU(),
                         nn.Linear(16, 2))


class Checkpointed(nn.Module):
    """Two blocks under torch.utils.checkpoint (non-reentrant), then a head."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(8, 8), nn.Tanh()) for _ in range(2))
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False)
        return self.head(x)


def train(label: str, model: nn.Module, counter: CompiledCounter) -> None:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for i in range(2):
        counter.section = f"{label}/{i}"
        with tracer.annotate(label, iteration=i):
            x = torch.randn(4, 8)
            model(x).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
        counter.section = None


def main(out: str) -> None:
    dist.init_process_group("gloo")
    counter = CompiledCounter().install_below()
    torch.manual_seed(0)
    train("ddp", DDP(mlp()), counter)
    from torch.distributed.fsdp import fully_shard
    model = mlp()
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    train("fsdp2", fully_shard(model), counter)
    train("checkpoint", DDP(Checkpointed()), counter)
    counter.dump(f"{out}/counts-{dist.get_rank()}.json")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
