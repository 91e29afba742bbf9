"""The per-worker entry point trace-run hands to torch's elastic agent.

torch's agent starts ``python -u -m instrument.launch.bootstrap [own options] -- SCRIPT|-m
MODULE ARGS`` once per rank. Before the user's code runs this module:

- turns SIGTERM (what the agent sends every worker when one rank fails or on Ctrl-C) into an
  exception while the tracer records, so it closes cleanly and flushes the rank's trace (once
  the trace is closed, SIGTERM ends the process at once, as by default);
- registers a faulthandler dump of every thread's Python stack on SIGUSR1 into
  ``traces/rank-<R>.stack.txt`` (the watchdog sends it when the run hangs: faulthandler writes
  from C, so it works even while the main thread is blocked inside a collective);
- on multi-node runs, tells trace-run where the collector for its node's traces is (gather.py);
- ends when trace-run dies, and then ends what its script forked too (orphans.py);

then runs the script as ``__main__`` with its own argv inside ``tracer.trace(...)``. A raised
exception still propagates after the tracer recorded it: torch's error file (read by the agent)
names the error, the traceback on stderr keeps the user's frames and the call into the library
(:func:`print_error`), and the process exits 1, as Python's would.
"""
from __future__ import annotations

import argparse
import faulthandler
import os
import runpy
import signal
import sys
import time
from types import FrameType
from typing import Optional

from torch.distributed.elastic.multiprocessing.errors import record

import tracer
from tracer.files import rundir
from tracer.vocab.library import ROOT, LibraryRule
from tracer.vocab.outcomes import TraceStatus
from tracer.vocab.user_frames import trim_traceback

from ..supervise import gather, orphans


class Terminated(KeyboardInterrupt):
    """SIGTERM from the agent: the rank was ended from outside (recorded as interrupted)."""


def _on_sigterm(signum: int, frame: Optional[FrameType]) -> None:
    # NOTE: raise once, and only while the tracer is still recording: a SIGTERM that lands while
    # the tracer closes (after the rank's own error, say) would cut its final flush short.
    session = tracer.active()
    if session is not None and session.status != TraceStatus.RUNNING:
        return
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Terminated(f"terminated by signal {signum}")


def parse(argv: list[str]) -> argparse.Namespace:
    """Own options before ``--``; after it ``SCRIPT ARGS`` or ``-m MODULE ARGS``."""
    if "--" not in argv:
        raise SystemExit("instrument.launch.bootstrap: expected '-- SCRIPT|-m MODULE [ARGS]'")
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="instrument.launch.bootstrap")
    parser.add_argument("--out", dest="run_dir", required=True)
    parser.add_argument("--steps", default=None)
    parser.add_argument("--stack-depth", type=int, default=64)
    parser.add_argument("--include-library-frames", action="store_true")
    parser.add_argument("--library", action="append", default=[])
    parser.add_argument("--no-device-time", action="store_true")
    parser.add_argument("--compile-eagerly", action="store_true")
    parser.add_argument("--no-memory", dest="memory", action="store_false")
    opts = parser.parse_args(argv[:split])
    target = argv[split + 1:]
    opts.module = None
    opts.script = None
    if target[:1] == ["-m"]:
        opts.module, opts.args = target[1], target[2:]
    else:
        opts.script, opts.args = target[0], target[1:]
    return opts


def keep_earlier_attempt(traces_dir: str, rank: int) -> None:
    """With --max-restarts, move this rank's files of the failed attempt to ``attempt-<n>/``.

    The agent restarts every worker in place; without this the new attempt's trace would
    overwrite the one that shows why the last attempt failed.
    """
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    if attempt == 0:
        return
    keep = os.path.join(traces_dir, f"attempt-{attempt - 1}")
    os.makedirs(keep, exist_ok=True)
    for name in os.listdir(traces_dir):
        if rundir.parse_rank_file(name) == rank:
            os.replace(os.path.join(traces_dir, name), os.path.join(keep, name))


ORPHANED = (f"trace-run ended (killed?) and the worker did not stop on SIGTERM within "
            f"{orphans.GRACE_S:g}s")


def _failed_after_the_launcher() -> None:
    """The script raised after trace-run died. The error follows from that end: a rank ended
    before this one left a collective it was in ("Connection closed by peer"). So the trace
    says interrupted, as the ended rank's does, not failed."""
    session = tracer.active()
    if session is not None and session.status == TraceStatus.RUNNING and orphans.orphaned():
        session.status, session.error = TraceStatus.INTERRUPTED, ORPHANED


def _orphaned() -> None:
    """trace-run died and this worker is still here after the kernel's SIGTERM (its script
    ignores SIGTERM, or its main thread is held in C): close the trace from this thread, unless
    the main thread is closing it already (then give it a while), and leave."""
    try:
        session = tracer.active()
        if session is not None and session.status == TraceStatus.RUNNING:
            from tracer.recorder.process import exits
            exits.leave(session, 128 + signal.SIGTERM, ended_by=ORPHANED)
        deadline = time.monotonic() + 10
        while tracer.active() is not None and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        os._exit(128 + signal.SIGTERM)


def _rank() -> int:
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


@record
def main(argv: Optional[list[str]] = None) -> None:
    opts = parse(sys.argv[1:] if argv is None else argv)
    traces_dir = os.path.join(opts.run_dir, rundir.TRACES)
    os.makedirs(traces_dir, exist_ok=True)
    keep_earlier_attempt(traces_dir, _rank())
    signal.signal(signal.SIGTERM, _on_sigterm)
    orphans.die_with_launcher(_orphaned)
    # Kept open for the life of the process: faulthandler writes to its file descriptor.
    stack_file = open(rundir.stack_file(traces_dir, _rank()), "w")
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    try:
        gather.announce(opts.run_dir)
    except Exception as exc:  # gathering is a convenience: never let it stop the training
        print(f"paratrace: rank {_rank()}: multi-node gathering disabled ({exc})",
              file=sys.stderr)

    if opts.module is not None:
        sys.argv = [opts.module, *opts.args]
        sys.path[0] = os.getcwd()          # what `python -m` puts first
    else:
        script = os.path.abspath(opts.script)
        sys.argv = [opts.script, *opts.args]
        sys.path[0] = os.path.dirname(script)   # what `python script.py` puts first
    try:
        with tracer.trace(traces_dir, steps=opts.steps, stack_depth=opts.stack_depth,
                          library_frames=opts.include_library_frames, library=opts.library,
                          device_time=not opts.no_device_time,
                          compiled="eager" if opts.compile_eagerly else "compiled",
                          memory=opts.memory):
            try:
                if opts.module is not None:
                    runpy.run_module(opts.module, run_name="__main__", alter_sys=True)
                else:
                    runpy.run_path(script, run_name="__main__")
            except BaseException:
                _failed_after_the_launcher()
                raise
    finally:
        # The trace is closed: nothing is left to flush, so a SIGTERM from here on just ends
        # the process (raised now, it would land in an atexit handler as a traceback).
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if orphans.orphaned():      # no trace-run left to end what the script forked
            # NOTE: the kernel sends the death signal again as it hands this process on to
            # the next parent: it must not cut the ending of the group short
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            orphans.end_own_group()


def print_error(exc: BaseException, argv: list[str]) -> None:
    """The script's error on stderr as Python (or torch's hook) prints it, its frames the
    user's and the call into the library (tracer.vocab.user_frames, as the recorded stacks
    are): no runpy, no bootstrap, no recorder wrapper (comm.py) to make it look as if
    paratrace failed."""
    try:
        specs = parse(argv).library
    except SystemExit:
        specs = []
    rule = LibraryRule.build(specs, always_user=(os.path.join(ROOT, "sample_runs"),))
    sys.excepthook(type(exc), exc, trim_traceback(exc, rule).__traceback__)


if __name__ == "__main__":
    try:
        main()
    except Terminated:
        sys.exit(128 + signal.SIGTERM)   # what a shell reports for a SIGTERMed process
    except Exception as error:           # torch's error file has it already (@record)
        print_error(error, sys.argv[1:])
        sys.exit(1)                      # what Python exits with on an uncaught exception
