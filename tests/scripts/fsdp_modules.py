"""FSDP2 under the tracer (2 ranks, gloo): a Sequential of 4 blocks of distinct widths and a
final Linear, ``fully_shard`` on each block and on the root, one forward and backward with
FSDP's own (implicit) backward prefetching, then another model whose blocks prefetch
explicitly (``set_modules_to_forward_prefetch`` / ``set_modules_to_backward_prefetch``).
torch's CommDebugMode counts each section's collectives in the same run (written to
OUT/comm-debug-<rank>.json).
Usage: torchrun --nproc-per-node 2 fsdp_modules.py OUT"""
import json
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.tensor.debug import CommDebugMode

import tracer
from comm_sections import counts

WIDTHS = (8, 12, 16, 20, 24)     # block i: Linear(WIDTHS[i], WIDTHS[i + 1]); tests/ reads them
OUTPUTS = 2


def model():
    """The 4 blocks and the final Linear, each block and the root sharded."""
    from torch.distributed.fsdp import fully_shard
    net = nn.Sequential(*[nn.Sequential(nn.Linear(WIDTHS[i], WIDTHS[i + 1]), nn.ReLU())
                          for i in range(len(WIDTHS) - 1)], nn.Linear(WIDTHS[-1], OUTPUTS))
    for block in list(net)[:-1]:
        fully_shard(block)
    fully_shard(net)
    return net


def step(name: str, net, debug: dict) -> None:
    x = torch.randn(4, WIDTHS[0])
    with CommDebugMode() as mode, tracer.annotate(name):
        net(x).sum().backward()
    debug[name] = counts(mode)


out = sys.argv[1]
with tracer.trace(out):
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    debug: dict = {}
    tracer.step()
    step("implicit", model(), debug)
    tracer.step()
    net = model()
    blocks = list(net)[:-1]
    for i, block in enumerate(blocks):
        if i + 1 < len(blocks):
            block.set_modules_to_forward_prefetch([blocks[i + 1]])
        if i > 0:
            block.set_modules_to_backward_prefetch([blocks[i - 1]])
    step("explicit", net, debug)
    with open(f"{out}/comm-debug-{dist.get_rank()}.json", "w") as fh:
        json.dump(debug, fh)
    dist.destroy_process_group()
