"""trace-run's launching room: its command line and the checks before anything starts
(command_line, preflight), the launch through torch's elastic agent (trace_run) or as one
process (single), and the per-worker entry point (bootstrap). It imports instrument.supervise,
which watches and records the run; supervise imports nothing of it.
"""
from __future__ import annotations

from tracer.vocab.console_errors import run_console


def console() -> int:
    """The ``trace-run`` console script (setup.py): trace_run.main, its bugs in one line. The
    launcher is imported only when it runs: a worker importing this package for its bootstrap
    loads none of it."""
    from .trace_run import main
    return run_console("trace-run", main)
