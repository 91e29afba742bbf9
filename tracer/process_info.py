"""Who is recording: the process's rank and world size before a process group exists, and the
metadata a trace starts with (docs/trace-format.md)."""
from __future__ import annotations

import os
import socket
import sys
import time
from typing import Optional

import torch
import torch.distributed as dist

from .format import FORMAT_VERSION


def rank_and_world() -> tuple:
    """From torch.distributed once it is initialized, else RANK / WORLD_SIZE, else 0 / 1."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return env_int("RANK") or 0, env_int("WORLD_SIZE") or 1


def env_int(name: str) -> Optional[int]:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def start_meta(rank: int, world_size: int, options: dict, clock_pairs: list,
               hot_path: str) -> dict:
    """The metadata of a trace's first batch (``hot_path``: "c" or "python", tracer/_native.py)."""
    return {
        "format_version": FORMAT_VERSION, "rank": rank, "world_size": world_size,
        "pid": os.getpid(), "host": socket.gethostname(), "start_ns": time.perf_counter_ns(),
        "start_unix": time.time(), "argv": list(sys.argv), "options": options,
        "torch": torch.__version__, "python": sys.version.split()[0], "hot_path": hot_path,
        "local_rank": env_int("LOCAL_RANK"), "node_rank": env_int("GROUP_RANK"),
        "clock_pairs": clock_pairs,
    }
