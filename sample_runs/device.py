"""Where the ranks run: CUDA + NCCL with one GPU per local rank, else CPU + gloo.

A pure decision from the flag, the GPUs this process sees and the ranks torchrun started on
this node (LOCAL_WORLD_SIZE), so that it can be tested without a GPU. Binding two ranks to one
GPU is what fails with "invalid device ordinal" (or NCCL's duplicate-GPU error), so ``cuda``
with too few GPUs is a configuration error, and ``auto`` falls back to CPU and says so.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from sample_runs.config import ConfigError


@dataclass(frozen=True)
class Placement:
    """The device type and process-group backend of every rank, and a one-line note for stderr
    when ``auto`` passed over GPUs that are present (None otherwise)."""

    device_type: str  # "cuda" or "cpu"
    backend: str  # "nccl" or "gloo"
    note: Optional[str] = None


CPU = Placement("cpu", "gloo")
CUDA = Placement("cuda", "nccl")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def choose_placement(choice: str, *, gpus: int, local_world_size: int) -> Placement:
    """``choice`` is the --device flag (auto, cpu, cuda); ``gpus`` what
    torch.cuda.device_count() says; ``local_world_size`` the ranks on this node."""
    enough = gpus >= local_world_size
    if choice == "cpu":
        return CPU
    if choice == "cuda":
        if gpus == 0 or not enough:
            raise ConfigError(
                f"--device cuda needs one GPU per local rank: "
                f"{_plural(local_world_size, 'rank')} on this node, {_plural(gpus, 'GPU')}; "
                "run fewer ranks per node or --device cpu")
        return CUDA
    if choice != "auto":
        raise ConfigError(f"--device must be auto, cpu or cuda, got {choice!r}")
    if gpus == 0:
        return CPU
    if enough:
        return CUDA
    return Placement("cpu", "gloo", note=(
        f"--device auto: {_plural(local_world_size, 'rank')} on this node but "
        f"{_plural(gpus, 'GPU')}, so CPU and gloo (--device cuda needs one GPU per local rank)"))
