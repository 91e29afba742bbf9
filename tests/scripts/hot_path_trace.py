"""Record a small training loop into argv[1]: the same program under either hot path
(PARATRACE_PURE_PYTHON=1 or not) must record the same rows (tests/integration/test_hotpath.py). It
takes every branch of on_op: forward and backward ops, checkpointing's recomputation, an autograd
Function (its forward runs with grad off), the optimizer, the autograd engine's final callback,
annotations naming phases, an op with keyword arguments, an op that fails. ``memory`` as argv[2]
records memory too (the C on_op looks op outputs up in the memory table)."""
import sys

import torch
from torch.utils.checkpoint import checkpoint

import tracer


class Scale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return grad * 2


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(16)
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x):
        parts = list(torch.chunk(self.fc(self.norm(x)), 2, dim=-1))    # a list argument
        return x + torch.cat(parts, dim=-1).relu()


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first, self.second = Block(), Block()

    def forward(self, x):
        x = checkpoint(self.first, x, use_reentrant=False)     # recomputed in backward
        return Scale.apply(self.second(x))


def batches(n):
    for _ in range(n):                    # a generator between the loop and the ops
        yield torch.randn(4, 16)


def main(out: str, memory: bool) -> None:
    torch.manual_seed(0)
    model = Model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    engine = torch.autograd.Variable._execution_engine

    def queue_final(grad):       # the engine's final callback: no node, grad off
        engine.queue_callback(lambda: model.first.fc.bias.grad.mul_(1.0))
        return grad

    model.first.fc.bias.register_hook(queue_final)
    with tracer.trace(out, clock_sync=False, memory=memory):
        for x in batches(3):
            with tracer.annotate("forward"):
                loss = model(x).square().mean()
            loss.backward()
            with tracer.annotate("sync", phase="grad_sync"):
                torch.zeros(2).sum()
            with torch.no_grad():
                torch.full((2, 2), 3.0).mul(2)          # no module, grad off: other
            try:
                torch.ones(2) @ torch.ones(3)
            except RuntimeError:
                pass
            torch.ones(3, dtype=torch.float64).add_(1)      # keyword arguments
            opt.step()
            opt.zero_grad()
            tracer.step()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:] == ["memory"])
