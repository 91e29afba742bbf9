"""``trace-whatif``: predict other parallel configurations of a recorded run.

    trace-whatif RUN --out DIR [--tp N] [--sp | --no-sp] [--pp N] [--dp N]
                 [--schedule S] [--virtual-stages V] [--microbatches M] [--target "OPTIONS"]...

The options given directly are one target; each ``--target "OPTIONS"`` (the same option names)
is another; with none, only the replay is written. Every target changes only what it names
from the recorded configuration (viz.whatif.targets). Open the run -> analyse it once ->
replay and predict (viz.whatif) -> the renderers of :mod:`viz.render.whatif` write
DIR/whatif/*.svg, DIR/whatif.json and DIR/whatif.html.
Bad options and targets that cannot be predicted are one line on stderr and exit status 2.
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys
from typing import Optional

from tracer.vocab.console_errors import CommandParser as _Parser
from tracer.vocab.console_errors import run_console

EXIT_USAGE = 2
PROG = "trace-whatif"
SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1")


class _UsageError(Exception):
    pass


def _whole(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}")
    return value


def _target_options(parser: argparse.ArgumentParser) -> None:
    """The reference GPT's option names (python -m sample_runs.train --help)."""
    parser.add_argument("--tp", type=_whole, help="tensor-parallel size")
    parser.add_argument("--sp", action=argparse.BooleanOptionalAction, default=None,
                        help="sequence parallelism on the TP group")
    parser.add_argument("--pp", type=_whole, help="pipeline stages")
    parser.add_argument("--dp", type=_whole, help="data-parallel size (default: the recorded "
                        "world over tp x pp; naming it predicts a world of tp x pp x dp)")
    parser.add_argument("--schedule", choices=SCHEDULES, help="pipeline schedule")
    parser.add_argument("--virtual-stages", type=_whole,
                        help="model chunks per pipeline rank (interleaved)")
    parser.add_argument("--microbatches", type=_whole, help="micro-batches per iteration")


def _changes(args: argparse.Namespace) -> dict:
    keys = ("tp", "sp", "pp", "dp", "schedule", "virtual_stages", "microbatches")
    return {k: getattr(args, k) for k in keys if getattr(args, k) is not None}


def parse(argv) -> tuple:
    """(run dir, out dir, jobs, targets): each target option -> value."""
    parser = _Parser(prog=PROG, description="Predict the step time, bubble and exposed "
                     "communication of other parallel configurations from one recording "
                     "(docs/whatif.md).")
    parser.add_argument("run_dir", help="a traced run (trace-run's --out directory)")
    parser.add_argument("--out", required=True, help="where to write whatif.json, "
                        "whatif.html and the predicted timelines")
    _target_options(parser)
    parser.add_argument("--target", action="append", default=[], metavar='"OPTIONS"',
                        help='another target, e.g. --target "--schedule gpipe" (repeatable)')
    parser.add_argument("--jobs", type=_whole, default=None, metavar="N",
                        help="analyse ranks in N worker processes")
    args = parser.parse_args(argv)
    targets = [_changes(args)] if _changes(args) else []
    one = _Parser(prog=f"{PROG} --target", add_help=False)
    _target_options(one)
    for text in args.target:
        try:
            words = shlex.split(text)
        except ValueError as exc:
            raise _UsageError(f"--target {text!r}: {exc}") from None
        found = _changes(one.parse_args(words))
        if not found:
            raise _UsageError(f"--target {text!r} names no option")
        targets.append(found)
    return args.run_dir, args.out, args.jobs, targets


def main(argv: Optional[list] = None) -> int:
    try:
        run_dir, out_dir, jobs, targets = parse(argv)
    except _UsageError as exc:
        return _fail(str(exc))
    from tracer.files.format import TraceError

    from .run import RunError
    from .whatif import SimulationError, TargetError
    try:
        index = run(run_dir, out_dir, targets, jobs)
    except (RunError, TraceError, TargetError, SimulationError) as exc:
        return _fail(str(exc))
    except OSError as exc:
        return _fail(f"{exc.filename}: {exc.strerror}" if exc.filename else str(exc))
    print(index, flush=True)
    return 0


def run(run_dir: str, out_dir: str, targets: list, jobs: Optional[int] = None) -> str:
    """Open -> analyse -> replay and predict -> the renderers; returns whatif.html's path."""
    from .analysis import analyse
    from .engine import Engine
    from .render import render_all
    from .render.whatif import PAGE, RENDERERS, WhatIfInput
    from .run import RunError, open_run
    from .whatif import what_if
    run = open_run(run_dir)
    try:
        os.makedirs(os.path.join(out_dir, "whatif"), exist_ok=True)
    except OSError as exc:
        raise RunError(f"{out_dir}: cannot create the output directory ({exc.strerror})") \
            from None
    with Engine(jobs) as engine:
        analysis = analyse(run, engine)
    result = what_if(analysis, targets)
    render_all(RENDERERS, WhatIfInput(result, run_dir), out_dir)
    return os.path.join(out_dir, PAGE)


def _fail(message: str) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def console() -> int:
    """The ``trace-whatif`` console script: main, its bugs in one line."""
    return run_console("trace-whatif", main)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(console())
