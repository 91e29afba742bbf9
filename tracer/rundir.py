"""The run directory's file names, defined once: the recorder and trace-run write them, viz and
the watchdog read them.

    DIR/run.json                    trace-run's record of the run (instrument.run_record)
    DIR/node.json                   multi-node: what this node learned at start (gather)
    DIR/summary.json, index.html    the report (viz)
    DIR/traces/rank-<R>.arrow       one trace per rank (tracer.format)
    DIR/traces/rank-<R>.device.arrow   its GPU activity, on CUDA (tracer.device_format)
    DIR/traces/rank-<R>.status.json the recorder's live status (tracer.status)
    DIR/traces/rank-<R>.stack.txt   Python stacks dumped on a hang (instrument.bootstrap)

``tracer.trace(DIR)`` alone writes the rank files straight into DIR; readers take both layouts.
Torch-free: reading a run never imports torch.
"""
from __future__ import annotations

import os
import re
from typing import Optional

TRACES = "traces"
RUN_RECORD = "run.json"
NODE_RECORD = "node.json"
SUMMARY = "summary.json"
INDEX = "index.html"

TRACE_EXT, DEVICE_EXT, STATUS_EXT, STACK_EXT = "arrow", "device.arrow", "status.json", "stack.txt"
# ranks as the recorder writes them: rank-01.arrow is no rank file
RANK_FILE = re.compile(r"^rank-(0|[1-9]\d*)\.(arrow|device\.arrow|status\.json|stack\.txt)$")


def rank_file(rank: int, ext: str = TRACE_EXT) -> str:
    """``rank-<R>.<ext>``: the name of one of a rank's files."""
    return f"rank-{int(rank)}.{ext}"


def trace_file(traces_dir: str, rank: int) -> str:
    return os.path.join(traces_dir, rank_file(rank, TRACE_EXT))


def device_file(traces_dir: str, rank: int) -> str:
    return os.path.join(traces_dir, rank_file(rank, DEVICE_EXT))


def status_file(traces_dir: str, rank: int) -> str:
    return os.path.join(traces_dir, rank_file(rank, STATUS_EXT))


def stack_file(traces_dir: str, rank: int) -> str:
    return os.path.join(traces_dir, rank_file(rank, STACK_EXT))


def parse_rank_file(name: str, ext: Optional[str] = None) -> Optional[int]:
    """The rank of a file named ``rank-<R>.<ext>`` (any of the rank extensions when ``ext`` is
    None), else None."""
    match = RANK_FILE.match(name)
    if match is None or (ext is not None and match.group(2) != ext):
        return None
    return int(match.group(1))


def traces_dir(run_dir: str) -> str:
    """Where a run's rank files are: ``DIR/traces`` for a trace-run directory, else DIR."""
    sub = os.path.join(run_dir, TRACES)
    return sub if os.path.isdir(sub) else run_dir


def rank_files(directory: str, ext: str = TRACE_EXT) -> dict:
    """rank -> path of every ``rank-<R>.<ext>`` file in ``directory``."""
    out = {}
    for name in os.listdir(directory):
        rank = parse_rank_file(name, ext)
        if rank is not None:
            out[rank] = os.path.join(directory, name)
    return out
