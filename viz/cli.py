"""Console entry points of viz: ``trace-report`` and ``trace-diff``, and the build step
``trace-run`` calls after a run. Errors are one line on stderr and exit status 2.

Arguments are parsed before anything heavy is imported, so a wrong option answers at once.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Optional


def build(run_dir: str, out_dir: Optional[str] = None) -> str:
    """Load the run in ``run_dir``, write summary.json and the report into ``out_dir``
    (default: ``run_dir``) and return the path of index.html. Raises viz.trace.RunError."""
    from .trace import load_run
    run = load_run(run_dir)
    out_dir = out_dir or run_dir
    _check_writable(out_dir)
    from .report import build_report
    from .summary import write_summary
    write_summary(run, out_dir)
    return build_report(run, out_dir)


def _check_writable(path: str) -> None:
    from .trace import RunError
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise RunError(f"{path}: cannot create output directory ({exc.strerror})") from None
    if not os.access(path, os.W_OK):
        raise RunError(f"{path}: output directory is not writable")


def _fail(prog: str, message: str) -> int:
    print(f"{prog}: error: {message}", file=sys.stderr)
    return 2


def _errors() -> tuple:
    """The exceptions that mean bad input (one-line messages), not bugs."""
    from tracer import TraceError

    from .trace import RunError        # RenderError (graphviz missing or failing) is a RunError
    return RunError, TraceError


def _print(text: str) -> None:
    """Print, and stay quiet if the reader went away (``trace-diff A B | head``)."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())   # no second error when Python flushes at exit
        sys.exit(0)


def report_main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="trace-report", description="Rebuild summary.json and the HTML report of a traced "
        "run from the traces on disk.")
    parser.add_argument("run_dir", help="a trace-run output directory (or a directory of "
                        "rank-<R>.arrow files)")
    parser.add_argument("--out", help="where to write the report (default: RUN_DIR)")
    args = parser.parse_args(argv)
    try:
        index = build(args.run_dir, args.out)
    except _errors() as exc:
        return _fail(parser.prog, str(exc))
    _print(index)
    return 0


def diff_main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="trace-diff", description="What changed between two traced runs: ops, FLOPs, "
        "communication, time, bubbles; matched by module, op, phase and call-graph node.")
    parser.add_argument("run_a", help="the baseline run directory")
    parser.add_argument("run_b", help="the changed run directory")
    parser.add_argument("--out", help="write diff.json and diff.html here")
    parser.add_argument("--top", type=int, default=15, help="rows in the terminal table")
    args = parser.parse_args(argv)
    from .trace import load_run
    try:
        a, b = load_run(args.run_a), load_run(args.run_b)
        from . import diff
        result = diff.diff_runs(a, b)
        _print(diff.format_table(result, top=args.top))
        if args.out:
            _check_writable(args.out)
            _print(diff.write_diff(result, a, b, args.out))
    except _errors() as exc:
        return _fail(parser.prog, str(exc))
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(report_main())
