"""The compiled run of docs/gpu.md on the CPU, for ``trace-run --no-launcher``: an MLP of Linear+GELU blocks
under torch.compile (inductor), AdamW, a few steps. On a GPU inductor fuses each GELU into a Triton
kernel no aten op launches; tests/integration/test_device_regions.py adds such launches to this
real recording and checks where the report puts them. Usage: trace-run --no-launcher [--out DIR]
compiled_mlp.py [STEPS]"""
import sys

import torch
import torch.nn as nn


class MLP(nn.Module):
    def __init__(self, width: int = 16, blocks: int = 3):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(width, width) for _ in range(blocks))

    def forward(self, x):                               # the compiled function
        for block in self.blocks:
            x = torch.nn.functional.gelu(block(x))
        return x


def main(steps: int) -> None:
    torch.manual_seed(0)
    model = torch.compile(MLP())
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(8, 16)
    for _ in range(steps):
        loss = model(x).square().mean()                 # the forward's call
        loss.backward()                                 # the backward's call
        opt.step()
        opt.zero_grad()


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
