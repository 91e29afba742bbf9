"""How much of the machine other processes took while a test's own subprocesses ran.

Timing checks against theory (pipeline bubbles) only mean something when each rank had a core;
tests measure the CPU time the whole machine spent busy, minus their own children's."""
from __future__ import annotations

import os
import resource
import time


def cpu_busy_s() -> float:
    """CPU seconds the whole machine spent busy (all cores), from /proc/stat."""
    with open("/proc/stat") as fh:
        fields = [int(x) for x in fh.readline().split()[1:]]
    idle = fields[3] + fields[4]     # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class ForeignLoad:
    """Context manager: ``.share`` is the fraction of all cores other processes used inside."""

    def __enter__(self) -> "ForeignLoad":
        self._busy, self._ours, self._t = cpu_busy_s(), children_cpu_s(), time.monotonic()
        return self

    def __exit__(self, *exc) -> None:
        foreign = (cpu_busy_s() - self._busy) - (children_cpu_s() - self._ours)
        self.share = foreign / ((time.monotonic() - self._t) * (os.cpu_count() or 1))
