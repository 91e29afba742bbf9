"""No orphans: workers end with their trace-run, and what a rank's script forked ends with it.

Plain torchrun leaves its workers training when it is SIGKILLed (they are reparented to PID 1),
and torch's agent signals a worker's process group only while the worker lives, so a process
the script forked outlives a rank that exited. Linux gives the means:

- **launcher side**: trace-run is a *child subreaper* (:func:`become_subreaper`): when a
  worker dies, whatever it forked becomes a child of trace-run instead of PID 1's.
  :class:`Strays` (ticked by the monitor thread) ends them while the run goes on: SIGTERM,
  then SIGKILL after :data:`GRACE_S` (a child blocked in C never runs a SIGTERM handler).
  :func:`end_orphans` ends the rest when the launch returns;
- **worker side** (:func:`die_with_launcher`, in the bootstrap): ``PR_SET_PDEATHSIG`` makes
  the kernel send the worker SIGTERM the moment trace-run dies, which the bootstrap turns into
  a clean close of the trace. A guard thread waits on trace-run's pidfd: when it dies, the
  guard ends the worker's own process group (torch starts each worker as the leader of a group
  its script's children inherit) and, if the worker is still there :data:`GRACE_S` later (its
  main thread held in C), closes the trace itself and leaves through ``os._exit``.

NOTE: nothing here calls ``waitpid(-1)``: reaping a worker would rob torch's agent of its exit
status (subprocess then reports 0). Only processes taken for orphans are reaped, by pid.
"""
from __future__ import annotations

import ctypes
import os
import select
import signal
import threading
import time
from typing import Callable, Optional

from .processes import ProcStat, children, processes, reap, send_signal, stat, terminate

ENV_LAUNCHER = "PARATRACE_LAUNCHER_PID"
GRACE_S = 3.0            # SIGTERM, then this long, then SIGKILL
PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER = 1, 36


def _prctl(option: int, value: int) -> bool:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):      # not Linux
        return False


# ----------------------------------------------------------------------------- launcher side
def become_subreaper() -> dict[str, str]:
    """Make this process (trace-run) the reaper of its workers' orphans; returns what the
    workers need to die with it (environment entries)."""
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    return {ENV_LAUNCHER: str(os.getpid())}


def _strays() -> dict[int, ProcStat]:
    """Children of this process that a dead worker left: they lead no process group (workers
    do: torch starts each in a session of its own) and are not in this process's group (a
    worker between fork and setsid is, for an instant)."""
    mine = os.getpgrp()
    return {pid: info for pid, info in children().items() if info[2] not in (pid, mine)}


class Strays:
    """While the workers run: what a finished or dead rank forked, ended a step at a time
    (:meth:`tick`, from the monitor thread: it never waits)."""

    def __init__(self, grace_s: float = GRACE_S):
        self.grace_s = grace_s
        self.termed: dict[int, float] = {}       # pid -> when it got SIGTERM

    def tick(self, now: Optional[float] = None) -> None:
        now = time.monotonic() if now is None else now
        found = _strays()
        for pid, info in found.items():
            if info[0] == "Z":
                reap(pid)
            elif pid not in self.termed:
                self.termed[pid] = now
                send_signal(pid, signal.SIGTERM)
            elif now - self.termed[pid] >= self.grace_s:
                send_signal(pid, signal.SIGKILL)
        self.termed = {pid: t for pid, t in self.termed.items() if pid in found}


def end_orphans(grace_s: float = GRACE_S) -> int:
    """Once the launch returned: every child of trace-run is something a worker forked (the
    workers were reaped by torch's agent). Ends them; their own children come over as they die,
    so it goes on until none is left. Returns how many it ended."""
    return terminate(children, grace_s, reap_them=True)


# ----------------------------------------------------------------------------- worker side
def die_with_launcher(on_orphaned: Callable[[], None]) -> None:
    """In a worker trace-run started: SIGTERM from the kernel when trace-run dies; the worker's
    process group ended; ``on_orphaned()`` from a guard thread if the worker is still there
    :data:`GRACE_S` later. Nothing when trace-run did not start this process (no
    :data:`ENV_LAUNCHER`, or another parent: a launcher nested in the script)."""
    try:
        launcher = int(os.environ.get(ENV_LAUNCHER, ""))
    except ValueError:
        return
    if os.getppid() != launcher:
        if stat(launcher) is None:       # it died before this process could ask: now
            on_orphaned()
        return
    # NOTE: the kernel sends it when the *thread* that forked this process exits; torch's agent
    # starts workers from trace-run's main thread, which lives as long as trace-run
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != launcher:          # died between the check and the prctl
        on_orphaned()
        return
    threading.Thread(target=_guard, args=(launcher, on_orphaned), name="paratrace-orphan-guard",
                     daemon=True).start()


def _guard(launcher: int, on_orphaned: Callable[[], None]) -> None:
    try:
        fd = os.pidfd_open(launcher)
    except (AttributeError, OSError):
        fd = None
    if fd is not None:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        poller.poll()                     # returns when the launcher has exited
        os.close(fd)
    else:
        while os.getppid() == launcher:
            time.sleep(0.5)
    started = time.monotonic()
    end_own_group()                       # trace-run, the subreaper, is gone: this rank's own
    time.sleep(max(0.0, GRACE_S - (time.monotonic() - started)))   # the SIGTERM path's chance
    on_orphaned()


def orphaned() -> bool:
    """Whether the trace-run that started this worker has died or is dying.

    NOTE: when a process with several threads is killed, its main thread can exit first: the
    kernel then hands its children to a thread still alive in it (the same process id, so
    ``getppid`` has not changed yet) and sends the death signal already. That main thread is a
    zombie by then (state Z in /proc), which is what tells a dying trace-run from a live one
    whose agent sent SIGTERM."""
    try:
        launcher = int(os.environ.get(ENV_LAUNCHER, ""))
    except ValueError:
        return False
    info = stat(launcher)
    return os.getppid() != launcher or info is None or info[0] in ("Z", "X")


def end_own_group(grace_s: float = GRACE_S) -> int:
    """End the other processes of this worker's process group: what its script forked (and
    did not move to a group of its own). Only a group leader does it: a process that is not
    (a bootstrap run by hand from a shell) would end its shell's job. Returns how many."""
    group = os.getpgrp()
    if group != os.getpid():
        return 0
    return terminate(lambda: processes(lambda pid, info: info[2] == group), grace_s,
                     reap_them=False)
