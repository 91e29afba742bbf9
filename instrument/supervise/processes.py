"""This machine's processes as trace-run sees them in /proc, and the one way it ends them.

:func:`terminate` is how the watchdog ends hung workers and how orphans ends what workers
forked: SIGTERM (a worker's bootstrap turns it into a clean close of its trace), then, after a
grace period, SIGKILL for what is left (a process blocked in C never runs a Python signal
handler).
"""
from __future__ import annotations

import os
import signal
import time
from typing import Callable, Optional

# (state, parent pid, process group), as /proc/<pid>/stat gives them
ProcStat = tuple[str, int, int]
_POLL_S = 0.05


def stat(pid: int) -> Optional[ProcStat]:
    """(state, parent pid, process group) of ``pid`` from /proc, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0].decode(), int(fields[1]), int(fields[2])


def processes(match: Callable[[int, ProcStat], bool]) -> dict[int, ProcStat]:
    """pid -> (state, ppid, pgid) of the processes ``match(pid, stat)`` accepts, but this one."""
    me, found = os.getpid(), {}
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) != me:
            info = stat(int(name))
            if info is not None and match(int(name), info):
                found[int(name)] = info
    return found


def children() -> dict[int, ProcStat]:
    """pid -> (state, ppid, pgid) of this process's children: from the children lists of its
    threads (a few entries to read, where a scan of /proc reads every process), else a scan."""
    me, found = os.getpid(), {}
    try:
        for tid in os.listdir(f"/proc/{me}/task"):
            with open(f"/proc/{me}/task/{tid}/children") as fh:
                for pid in map(int, fh.read().split()):
                    info = stat(pid)
                    if info is not None and info[1] == me:
                        found[pid] = info
    except OSError:            # a kernel without the children lists
        return processes(lambda pid, info: info[1] == me)
    return found


def is_child(pid: int) -> bool:
    """A live child of this process (the agent runs in trace-run: its workers are): never
    signal a stale pid."""
    info = stat(pid)
    return info is not None and info[1] == os.getpid() and info[0] != "Z"


def live_children(pids: list[int]) -> Callable[[], dict[int, ProcStat]]:
    """For :func:`terminate`: those of ``pids`` that are still this process's children."""
    def find() -> dict[int, ProcStat]:
        me = os.getpid()
        return {pid: info for pid, info in ((p, stat(p)) for p in pids)
                if info is not None and info[1] == me}
    return find


def send_signal(pid: int, sig: int) -> None:
    """``kill(pid, sig)``; a process that is gone (or not ours to signal) is left alone."""
    try:
        os.kill(pid, sig)
    except OSError:
        pass


def reap(pid: int) -> None:
    """Collect an exited child's status, if it has exited."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def terminate(find: Callable[[], dict[int, ProcStat]], grace_s: float, *, reap_them: bool
              ) -> int:
    """SIGTERM what ``find`` returns (and what it returns later: a dying process's children
    move over), SIGKILL what is left after ``grace_s``; ``reap_them``: they are this process's
    children, collected when they exit. Returns how many it signalled."""
    seen: set[int] = set()
    deadline, sig = time.monotonic() + grace_s, signal.SIGTERM
    while True:
        found = find()
        live = [pid for pid, info in found.items() if info[0] != "Z"]
        for pid in found:
            if reap_them and found[pid][0] == "Z":
                reap(pid)
        if not live:
            return len(seen)
        for pid in live:
            if pid not in seen or sig == signal.SIGKILL:
                send_signal(pid, sig)
        seen.update(live)
        if time.monotonic() >= deadline:
            if sig == signal.SIGKILL:      # unkillable (uninterruptible sleep): leave it
                return len(seen)
            deadline, sig = time.monotonic() + grace_s, signal.SIGKILL
            continue
        time.sleep(_POLL_S)
