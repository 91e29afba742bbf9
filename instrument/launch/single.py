"""``trace-run --no-launcher SCRIPT ARGS``: one process, traced as ``python SCRIPT ARGS`` runs it.

cProfile, pyinstrument and viztracer wrap a script without a launcher; so does this: the script
runs in one child process of trace-run (``python -m instrument.launch.bootstrap ... -- SCRIPT
ARGS``) with trace-run's environment unchanged, so it sees no ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK`` or ``MASTER_ADDR`` unless they were already set, and takes the path it takes
under plain ``python`` (nanoGPT's ``train.py`` its single-process path, not DDP). Everything
after the launch is trace-run's: the watchdog (``--timeout``), run.json and the same report.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from types import FrameType
from typing import Optional

from tracer.files.status import read_statuses
from tracer.vocab.outcomes import FailureKind, RankStatus, failure

from ..supervise import orphans
from ..supervise.monitor import Monitor, say
from ..supervise.run_outcome import EXIT_HANG, Outcome, exit_status

# torchrun options that start more than one process or reach other machines: refused with
# --no-launcher, which starts exactly one (dest -> the value that means "not given")
_LAUNCHER_ONLY = {"nnodes": "1:1", "node_rank": None, "rdzv_endpoint": "", "standalone": False,
                  "max_restarts": 0}


@dataclass(frozen=True)
class SingleProcess:
    """The launch configuration trace-run's record needs, for one process on this node."""

    nproc_per_node: int = 1
    min_nodes: int = 1
    max_nodes: int = 1


def check_options(args: argparse.Namespace) -> None:
    """--no-launcher runs one process: torchrun options that say otherwise are a usage error
    (raised as ValueError with the message; the caller turns it into its one line)."""
    if args.nproc_per_node not in (None, "1"):
        raise ValueError(f"--no-launcher runs one process; --nproc-per-node "
                         f"{args.nproc_per_node} needs the launcher (drop --no-launcher)")
    for dest, unset in _LAUNCHER_ONLY.items():
        if getattr(args, dest, unset) not in (unset, None, "1", 0):
            option = "--" + dest.replace("_", "-")
            raise ValueError(f"--no-launcher runs one process on this machine; {option} "
                             "needs the launcher (drop --no-launcher)")
    args.nproc_per_node = "1"


def launch(argv: list[str], traces_dir: str, what: str, *, timeout: Optional[float]) -> Outcome:
    """Run ``python argv`` (the bootstrap and the script) as one child, watched like the
    launcher's workers, and say how it ended."""
    say(f"running {what} in one process, without a launcher")
    outcome = Outcome()
    os.environ.update(orphans.become_subreaper())   # the child dies with trace-run (orphans.py)
    monitor = Monitor(traces_dir, ranks=1, timeout_s=timeout).start()
    try:
        code, stopped_by = _run(argv)
    finally:
        monitor.stop()
        orphans.end_orphans()    # what the script forked and left behind
    rank = next(iter(read_statuses(traces_dir)), 0)
    if monitor.hang is not None:
        outcome.ranks = {str(rank): {"status": RankStatus.FAILED, "exit_code": code,
                                     "failure": None}}
        outcome.add_hang(monitor.hang, EXIT_HANG)
    elif stopped_by is not None:
        outcome.interrupted, outcome.exit_code = True, 128 + stopped_by
    elif code == 0:
        outcome.ranks = {str(rank): {"status": RankStatus.OK, "exit_code": 0, "failure": None}}
    else:
        # what its tracer recorded, or nothing: its exit code says it
        status = read_statuses(traces_dir).get(rank, {})
        facts = failure(FailureKind.ERROR, cause=status.get("error"))
        outcome.ranks = {str(rank): {"status": RankStatus.FAILED, "exit_code": code,
                                     "terminated": False, "failure": facts}}
        outcome.first_failure, outcome.exit_code = rank, exit_status(code)
    return outcome


def _run(argv: list[str]) -> tuple[int, Optional[int]]:
    """(the child's exit code, the signal that stopped trace-run or None). Ctrl-C reaches the
    child from the terminal as it reaches trace-run; a SIGTERM to trace-run is passed on. Either
    way the child's tracer closes its trace and trace-run waits for it."""
    proc = subprocess.Popen([sys.executable, *argv])
    stopped: list[int] = []

    def forward(signum: int, frame: Optional[FrameType]) -> None:
        stopped.append(signum)
        if proc.poll() is None:
            proc.send_signal(signum)
    previous = signal.signal(signal.SIGTERM, forward)
    try:
        while True:
            try:
                return proc.wait(), (stopped[0] if stopped else None)
            except KeyboardInterrupt:
                stopped.append(signal.SIGINT)
    finally:
        signal.signal(signal.SIGTERM, previous)

