"""One model run four ways under the tracer (one process, into argv[1]): eagerly, as the
GraphModule torch.export makes (FX's generated code), unflattened into InterpreterModules that
torch.fx.Interpreter runs node by node (what torch.distributed.pipelining's pipeline() builds), and
unflattened to run as generated code. Each run is a forward and a backward in an annotation named
after it. The same program under either hot path (PARATRACE_PURE_PYTHON=1 or not) must record the
same rows (tests/integration/test_stacks_fx.py). The exports are made before the trace starts.
Usage: python fx_stacks.py OUT"""
import sys

import torch
import torch.nn as nn

import tracer


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(width, width), nn.Linear(width, width)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        return self.fc2(h) + x


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block(8) for _ in range(2)])

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x.tanh()


def run(name: str, module, x) -> None:
    with tracer.annotate(name):
        module(x).sum().backward()
    for param in module.parameters():     # the runs share parameters: no accumulation
        param.grad = None


def main(out: str) -> None:
    torch.manual_seed(0)
    model = Model()
    x = torch.randn(4, 8)
    exported = torch.export.export(model, (x,))
    unflatten = torch.export.unflatten
    modules = {"eager": model, "generated": exported.module(),
               "interpreted": unflatten(exported)}
    disable = getattr(sys.modules["torch.export.unflatten"], "_disable_interpreter", None)
    if disable is not None:          # a private switch: feature-detected
        with disable():
            modules["interpreted-as-generated"] = unflatten(exported)
    with tracer.trace(out):
        for name, module in modules.items():
            run(name, module, x)
            run(name, module, x)      # a second time: the stacks' cached nodes


if __name__ == "__main__":
    main(sys.argv[1])
