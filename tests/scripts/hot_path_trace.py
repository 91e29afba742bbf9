"""Record a small training loop into argv[1]: the same program under either hot path
(PARATRACE_PURE_PYTHON=1 or not) must record the same rows (tests/test_hotpath.py)."""
import sys

import torch

import tracer


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(16)
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x):
        parts = list(torch.chunk(self.fc(self.norm(x)), 2, dim=-1))    # a list argument
        return x + torch.cat(parts, dim=-1).relu()


def batches(n):
    for _ in range(n):                    # a generator between the loop and the ops
        yield torch.randn(4, 16)


def main(out: str) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(Block(), Block())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with tracer.trace(out, clock_sync=False):
        for x in batches(3):
            with tracer.annotate("forward"):
                loss = model(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            tracer.step()


if __name__ == "__main__":
    main(sys.argv[1])
