"""Waiting for something to happen (a file, a line, a process's end) without sleeping for a
fixed time: poll the thing itself, with a bound that only ends a hung test."""
from __future__ import annotations

import time


def wait_until(condition, what: str, timeout_s: float = 120.0, poll_s: float = 0.05) -> None:
    """Poll ``condition()`` until it holds; fail naming ``what`` after ``timeout_s`` (a bound
    for a loaded machine, never a measurement)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:g}s"
        time.sleep(poll_s)


def alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie waiting to be reaped does not)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
