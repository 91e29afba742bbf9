"""Suite-wide settings: GPU-only tests carry the ``gpu`` marker and are skipped cleanly where
CUDA is absent; everything else runs on the CPU (multi-rank runs with gloo), also on a machine
with GPUs, through :data:`CPU_ONLY` in the environment of the processes tests start."""
from __future__ import annotations

import pytest

# Merged into the environment of every process a test starts: no GPU is visible to it, so the
# reference GPT and the test scripts take the CPU and gloo whatever the machine has.
CPU_ONLY = {"CUDA_VISIBLE_DEVICES": ""}


def pytest_collection_modifyitems(config, items):
    gpu = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu:
        return
    import torch
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA: no GPU on this machine")
    for item in gpu:
        item.add_marker(skip)
