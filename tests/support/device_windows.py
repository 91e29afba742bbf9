"""Device windows without a GPU, for the recorder's device tests: a small training loop, the CPU
activity of torch.profiler standing in for CUDA (a window per recorded step), and three recorded
steps whose windows the flusher has all taken."""
from __future__ import annotations

import torch

import tracer
from tracer.recorder.device import kineto_windows as device_module
from tracer.recorder import session as session_module
from tracer.recorder.device.kineto_windows import DeviceRecorder
from tracer.recorder.device.cupti_direct import SOURCE_ENV

from support.waiting import wait_until

# The start of a script run apart (python -c) with device windows on the CPU stand-in, as
# cpu_stands_in_for_cuda does in-process: Kineto's windows asked for by name (the default,
# CUPTI driven directly, would find the libcupti of a CUDA build of torch and refuse to start
# without a GPU), a window per recorded step, a model and an optimizer
STAND_IN_SCRIPT = """
import os
os.environ["PARATRACE_DEVICE_SOURCE"] = "kineto"
import tracer
from tracer.recorder.device import kineto_windows as device_module
from tracer.recorder import session as session_module
from tracer.recorder.device.kineto_windows import DeviceRecorder
session_module.cuda_in_use = lambda: True
DeviceRecorder.activity = "CPU"
device_module.WINDOW_S = 0.0
model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
"""


def train(steps: int) -> None:
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        opt.zero_grad()


def cuda_mlp_steps(warm_up: int = 3):
    """A small MLP with AdamW and a batch on the GPU, ``warm_up`` steps run untraced (cuBLAS
    and the allocator); returns ``steps(n)``, which trains n more steps."""
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.GELU(),
                                torch.nn.Linear(256, 256)).cuda()
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(64, 256, device="cuda")

    def steps(n: int) -> None:
        for _ in range(n):
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
    steps(warm_up)
    return steps


def cpu_stands_in_for_cuda(monkeypatch) -> None:
    monkeypatch.setenv(SOURCE_ENV, "kineto")        # Kineto's windows (see STAND_IN_SCRIPT)
    monkeypatch.setattr(session_module, "cuda_in_use", lambda: True)
    monkeypatch.setattr(DeviceRecorder, "activity", "CPU")
    monkeypatch.setattr(device_module, "WINDOW_S", 0.0)     # a window per recorded step


def windows_of_three_steps(out: str) -> None:
    """Record steps 1-3 of six (a window each), then wait until the flusher has taken every
    window (a bound, not a measurement: it writes at least every flush_interval)."""
    with tracer.trace(out, steps="1-3") as session:
        train(6)
        device = session._device
        wait_until(lambda: device.windows == 3 and not device._pending,
                   "the flusher taking the three windows")
