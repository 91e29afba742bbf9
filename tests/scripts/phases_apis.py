"""The phases of real training APIs under the tracer, every case in one launch (2 ranks, gloo):
DDP with no_sync gradient accumulation, FSDP2 (fully_shard), non-reentrant activation
checkpointing inside a parent module, gradients all-reduced by hand after backward, collectives
outside modules that carry no gradient (a loss, a seed, parameters in setup, a barrier), an
annotation overriding a phase, and optimizer steps that run a closure (SGD, LBFGS). torch's
CommDebugMode counts the DDP and FSDP2 sections in the same run, and the closure cases count
their own calls (written to OUT/comm-debug-<rank>.json).
Usage: torchrun --nproc-per-node 2 phases_apis.py OUT"""
import json
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.tensor.debug import CommDebugMode
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint

import tracer
from comm_sections import counts


class Block(nn.Module):
    """Two equal Linear layers: a recomputed op must land on the one that computes it."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blk, self.head = Block(), nn.Linear(8, 2)

    def forward(self, x):
        return self.head(checkpoint(self.blk, x, use_reentrant=False))


def _double(x):
    return x * 2                                     # the first op inside the Function's forward


class Double(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return _double(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * 2


def function_case() -> None:
    x = torch.randn(4, requires_grad=True)
    with tracer.annotate("function"):
        y = Double.apply(x)                          # APPLY LINE: its backward belongs here
        y.sum().backward()


def ddp_case(debug: dict) -> None:
    inner = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    with tracer.annotate("ddp-setup"):
        model = DDP(inner)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 8)
    # NOTE: CommDebugMode around DDP's forward fails in its own module tracker (torch 2.13):
    # it counts the backward passes only, where DDP communicates
    with tracer.annotate("ddp-accumulate"), model.no_sync():
        loss = model(x).sum()
        with CommDebugMode() as mode:
            loss.backward()
    with tracer.annotate("ddp-sync"):
        loss = model(x).sum()
        with CommDebugMode() as sync_mode:
            loss.backward()
    opt.step()
    debug["ddp-accumulate"], debug["ddp-sync"] = counts(mode), counts(sync_mode)


def fsdp_case(debug: dict) -> None:
    from torch.distributed.fsdp import fully_shard
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))
    with tracer.annotate("fsdp-setup"):
        for layer in model:
            fully_shard(layer)
        fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with CommDebugMode() as mode, tracer.annotate("fsdp"):
        model(torch.randn(4, 8)).sum().backward()
    debug["fsdp"] = counts(mode)
    opt.step()


def checkpoint_case() -> None:
    net = Net()
    with tracer.annotate("checkpoint"):
        net(torch.randn(4, 8)).sum().backward()


def manual_sync_case() -> None:
    model = nn.Linear(8, 8)
    with tracer.annotate("manual"):
        loss = model(torch.randn(4, 8)).sum()
        loss.backward()
        for param in model.parameters():
            dist.all_reduce(param.grad)                  # gradients after backward: grad_sync
        dist.all_reduce(loss.detach().clone())           # the loss: not a gradient
        with tracer.annotate("report", phase="other"):   # an annotation wins
            dist.all_reduce(model.weight.grad)
    with tracer.annotate("outside"):                     # grad mode on, no module: other
        seed = torch.tensor([1234])
        dist.broadcast(seed, 0)                          # a seed
        dist.broadcast(model.weight, 0)                  # parameters (setup)
        gathered = [torch.zeros(1) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, loss.detach().reshape(1))   # a metric gathered for logging
        dist.barrier()


def closure_case(debug: dict) -> None:
    """optimizer.step(closure): the closure's forward, backward and DDP's bucket all-reduce
    keep their phases; only the update is the optimizer's. LBFGS calls it several times."""
    model = DDP(nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)))
    x = torch.randn(4, 8)
    for name, opt in (("closure-sgd", torch.optim.SGD(model.parameters(), lr=0.1)),
                      ("closure-lbfgs", torch.optim.LBFGS(model.parameters(), max_iter=3))):
        calls = []

        def closure():
            calls.append(1)
            opt.zero_grad()
            loss = model(x).square().mean()
            loss.backward()
            return loss
        with tracer.annotate(name):
            if name == "closure-sgd":
                opt.step(closure)                        # positional
            else:
                opt.step(closure=closure)
        debug[name] = len(calls)


out = sys.argv[1]
with tracer.trace(out):
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    debug: dict = {}
    tracer.step()
    ddp_case(debug)
    tracer.step()
    fsdp_case(debug)
    tracer.step()
    checkpoint_case()
    function_case()
    manual_sync_case()
    closure_case(debug)
    with open(f"{out}/comm-debug-{dist.get_rank()}.json", "w") as fh:
        json.dump(debug, fh)
    dist.destroy_process_group()
