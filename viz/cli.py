"""Console entry points of viz: ``trace-report`` and ``trace-diff``, and the build step
``trace-run`` calls after a run. Each only orders the steps: open the run -> analyse it once
(:mod:`viz.analysis`) -> its problems on stderr (:mod:`viz.views.problems`) -> for the report,
the call graphs it draws (:mod:`viz.analysis.report_callgraphs`) -> the views -> its registry
of renderers (:mod:`viz.render.report`: summary.json, the report;
:mod:`viz.render.diff`: the diff's table, files and page), each handed one input object.
This is the top layer: only the commands import every layer (docs/architecture.md).

Errors are one line on stderr and exit status 2. Every damaged or missing trace is named on
stderr, one line each, and the report is built from what was readable; the exit status is then
1 when a rank's trace could not be read at all, 0 when damaged traces were partly recovered
(docs/report.md). Arguments are parsed before anything heavy is imported, so a wrong option
answers at once. On a terminal, a progress display on stderr shows how far the work got
(:mod:`viz.render.progress`); elsewhere nothing extra is printed.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, Optional

from tracer.vocab.console_errors import EXIT_USAGE, CommandParser, run_console

EXIT_UNREADABLE = 1


def _stderr(prog: str) -> Callable[[str], None]:
    return lambda line: print(f"{prog}: {line}", file=sys.stderr, flush=True)


def build(run_dir: str, report_dir: Optional[str] = None, *,
          warn: Optional[Callable[[str], None]] = None, jobs: Optional[int] = None,
          dask: Optional[str] = None, kineto: tuple = (), progress=None,
          reported: frozenset = frozenset(), sources: bool = True,
          kineto_limit: Optional[int] = None) -> tuple:
    """Analyse the run in ``run_dir`` and write summary.json and the report into ``report_dir``
    (default: ``run_dir``). Returns (index.html's path, the analysis). Each damaged or missing
    trace goes to ``warn`` as one line; the per-rank work runs in ``jobs`` processes (default:
    one per core) or on the Dask scheduler at ``dask``; ``kineto``: torch.profiler exports
    (``[R=]FILE`` or ``DIR``), merged into the run's GPU time, or, when ``run_dir`` has no
    traces (or only traces imported from exports), imported as the run itself
    (tracer.kineto.imported_run; ``kineto_limit``: bytes of JSON a .gz may expand to); ``progress``
    (viz.render.progress.Progress, default: none shown) follows the work; ``reported``: ranks
    whose failure the caller already named; ``sources=False``: no source file is read
    (``--no-source``). Raises viz.run.RunError, viz.render.callgraph_svg.RenderError or
    tracer.kineto.chrome_trace.KinetoError."""
    from .analysis import analyse
    from .analysis.callgraphs.source_files import RecordedSources, reading
    from .analysis.report_callgraphs import report_callgraphs
    from .engine import Engine
    from .render import render_all
    from .render.progress import Progress
    from .render.report import PAGE, RENDERERS, ReportInput
    from .run import open_run
    from .views.callgraph_pages import report_views
    from .views.problems import problem_lines
    progress = progress or Progress()
    warn = warn or _stderr("trace-report")
    left_out = []
    if kineto and _exports_are_the_run(run_dir):
        left_out = _import(os.path.abspath(run_dir), kineto, jobs, dask, progress, warn,
                           kineto_limit)
        kineto = ()
    run = open_run(run_dir)
    report_dir = report_dir or run_dir
    _check_not_another_run(report_dir, run)
    _check_writable(report_dir)
    exports = kineto_ranks(kineto, run)
    with Engine(jobs, dask) as engine:
        engine = _Counted(engine, progress)
        with progress.phase(f"reading {len(run.files)} traces"):
            analysis = analyse(run, engine, exports)
        analysis.left_out = left_out
        for line in problem_lines(analysis, reported=reported):
            warn(line)
        training = _training(analysis, engine, progress)
        recorded = RecordedSources(mine.meta for mine in analysis.ranks.values()) \
            if sources else None
        with reading(recorded):
            with progress.phase("building the call graphs"):
                graphs = report_callgraphs(analysis, training)
                views = report_views(graphs)
            report = ReportInput(analysis, views, recorded, progress)
            render_all(RENDERERS, report, report_dir)
    for line in report.problems:
        warn(line)
    return os.path.join(report_dir, PAGE), analysis


def _training(analysis, engine, progress):
    """The analysis over the training steps the call graphs show
    (:func:`viz.analysis.report_callgraphs.training`), a phase of the progress display of its
    own where it reads some rank's trace again."""
    from .analysis.report_callgraphs import recounts, training
    if not recounts(analysis):
        return training(analysis)
    with progress.phase("counting the training steps"):
        return training(analysis, engine)


def _exports_are_the_run(run_dir: str) -> bool:
    """``--kineto`` with no recording: a directory without traces, or whose traces were all
    imported from exports before (a new import replaces them)."""
    from tracer.kineto.imported_run import has_traces, is_imported_run
    return not has_traces(run_dir) or is_imported_run(run_dir)


def _import(run_dir: str, kineto: tuple, jobs, dask, progress, warn, limit) -> list:
    """Import the exports into ``run_dir``'s traces; the lines of the files left out."""
    from .engine import Engine
    from tracer.kineto.imported_run import import_exports
    _check_writable(run_dir)
    with Engine(jobs, dask) as engine:
        with progress.phase(f"importing {len(kineto)} torch.profiler export(s)"):
            result = import_exports(run_dir, list(kineto), _Counted(engine, progress), limit)
    for line in result.left_out:
        warn(f"{line}; left out")
    return result.left_out


class _Counted:
    """An Engine whose tasks count as steps of the current progress phase."""

    def __init__(self, engine, progress):
        self._engine, self._progress = engine, progress

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def map(self, fn: Callable, tasks: list, then: Optional[Callable] = None) -> list:
        self._progress.expect(len(tasks))
        if self._engine.jobs == 1 and not self._engine.dask:
            # one task at a time in this process: the bar moves after each rank
            out = []
            for task in tasks:
                out.extend(self._engine.map(fn, [task], then))
                self._progress.advance()
            return out
        out = self._engine.map(fn, tasks, then)
        self._progress.advance(len(tasks))
        return out


def kineto_ranks(entries, run) -> dict:
    """rank -> exports to merge into a recording (tracer.kineto.inputs.merge_ranks)."""
    from tracer.kineto.inputs import merge_ranks
    # absolute: the workers that merge them may run elsewhere (--dask)
    return {rank: [os.path.abspath(p) for p in paths]
            for rank, paths in merge_ranks(list(entries), run).items()} if entries else {}


def exit_status(analysis) -> int:
    """0, or 1 when something given could not be read at all: a rank's trace, a rank of the
    world without one (a recording), an export left out or unusable (exports: ranks of the
    world no export was given for are listed, not an error)."""
    exports_failed = bool(analysis.left_out) or \
        any(r.export_errors for r in analysis.ranks.values())
    if analysis.imported:
        return EXIT_UNREADABLE if exports_failed or analysis.unreadable else 0
    return EXIT_UNREADABLE if analysis.any_missing or exports_failed else 0


def _check_not_another_run(report_dir: str, run) -> None:
    """Refuse to write a report over another run's (its summary.json and index.html)."""
    from tracer.files import rundir

    from .run import RunError
    if os.path.realpath(report_dir) == os.path.realpath(run.dir):
        return
    for holder in (report_dir, os.path.join(report_dir, rundir.TRACES)):
        try:
            names = os.listdir(holder)
        except OSError:
            continue
        if rundir.RUN_RECORD in names or any(rundir.parse_rank_file(name) is not None
                                              for name in names):
            raise RunError(f"--out {report_dir} is another run's directory; its report would be "
                           "overwritten (choose a new DIR)")


def _still_written(report_dir: str) -> str:
    """Why ``report_dir`` must not be written now (a trace-run still writes that run: its traces,
    run.json and report would mix with this report), or ''. Reading a live run's traces into
    another ``--out`` is fine: they are readable while they grow."""
    from tracer.files import rundir
    pid = rundir.run_writer(report_dir)
    if pid is None:
        return ""
    return (f"{report_dir} is still being written by trace-run (pid {pid or 'unknown'}); run "
            "trace-report when it has ended, or write elsewhere with --out DIR")


def _check_writable(path: str) -> None:
    from .run import RunError
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise RunError(f"{path}: cannot create output directory ({exc.strerror})") from None
    if not os.access(path, os.W_OK):
        raise RunError(f"{path}: output directory is not writable (write elsewhere with "
                       "--out DIR)")


def _fail(prog: str, message: str) -> int:
    print(f"{prog}: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def _errors() -> tuple:
    """The exceptions that mean bad input (one-line messages), not bugs."""
    from tracer.files.format import TraceError
    from tracer.kineto.chrome_trace import KinetoError

    from .render.callgraph_svg import RenderError   # graphviz missing or failing
    from .run import RunError
    return RunError, RenderError, TraceError, KinetoError, OSError


def _print(text: str) -> None:
    """Print, and stay quiet if the reader went away (``trace-diff A B | head``)."""
    try:
        print(text, flush=True)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())   # no second error when Python flushes at exit
        sys.exit(0)


def _message(exc: Exception) -> str:
    if isinstance(exc, OSError) and exc.filename:
        return f"{exc.filename}: {exc.strerror or exc}"
    return str(exc)


def _at_least(minimum: int):
    """An argparse type: a whole number >= ``minimum``."""
    def whole(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be a whole number >= {minimum}, "
                                             f"got {text!r}")
        return value
    return whole


_positive = _at_least(1)


def _engine_options(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--jobs", type=_positive, default=None, metavar="N",
                        help="analyse ranks in N worker processes (default: one per core; "
                        "small runs stay in one process)")
    where.add_argument("--dask", metavar="ADDRESS", default=None,
                        help="analyse ranks on a Dask cluster (tcp://host:port of its "
                        "scheduler; its workers must see the traces at the same paths; "
                        "pip install 'paratrace[dask]')")


def report_main(argv=None) -> int:
    parser = CommandParser(
        prog="trace-report", description="Rebuild summary.json and the HTML report of a traced "
        "run from the traces on disk.")
    parser.add_argument("run_dir", help="a trace-run output directory (or a directory of "
                        "rank-<R>.arrow files; with --kineto and no traces, where the "
                        "exports' run goes)")
    parser.add_argument("--out", help="where to write the report (default: RUN_DIR)")
    parser.add_argument("--kineto", nargs="+", default=[], metavar="[R=]FILE|DIR",
                        help="torch.profiler Chrome-trace exports (.json or .json.gz; a "
                        "directory of them): merged as GPU time into the run's ranks, or, "
                        "when RUN_DIR has no traces, analysed on their own (docs/kineto.md); "
                        "rank R's, or the rank its distributedInfo names")
    parser.add_argument("--kineto-max-mb", type=_positive, default=None, metavar="MB",
                        help="stop reading a .json.gz export past this many MiB of JSON "
                        "(default: 64 times the file, at least 64 MiB)")
    parser.add_argument("--no-source", action="store_true",
                        help="read no source file: source pages list only the lines that "
                        "issued ops (a report to share)")
    _engine_options(parser)
    args = parser.parse_args(argv)
    from .render.progress import for_stderr
    busy = _still_written(args.out or args.run_dir)
    if busy:
        return _fail(parser.prog, busy)
    try:
        with for_stderr() as progress:
            index, analysis = build(
                args.run_dir, args.out, warn=_stderr(parser.prog), jobs=args.jobs,
                dask=args.dask, kineto=args.kineto, progress=progress,
                sources=not args.no_source,
                kineto_limit=args.kineto_max_mb << 20 if args.kineto_max_mb else None)
    except _errors() as exc:
        return _fail(parser.prog, _message(exc))
    _print(index)
    return exit_status(analysis)


def diff_main(argv=None) -> int:
    parser = CommandParser(
        prog="trace-diff", description="What changed between two traced runs: ops, FLOPs, "
        "communication, time, bubbles; matched by module, op, phase and call-graph node.")
    parser.add_argument("run_a", help="the baseline run directory")
    parser.add_argument("run_b", help="the changed run directory")
    parser.add_argument("--out", help="write diff.json and diff.html here")
    parser.add_argument("--top", type=_at_least(0), default=15, metavar="N",
                        help="rows in the terminal table (default 15)")
    _engine_options(parser)
    args = parser.parse_args(argv)
    from .render.progress import for_stderr
    from .run import open_run
    try:
        a, b = open_run(args.run_a), open_run(args.run_b)
        if args.out:
            _check_writable(args.out)
        from .analysis import analyse
        from .diff import compare_runs
        from .engine import Engine
        from .render import render_all
        from .render.diff import FILES, PAGE, TERMINAL, DiffInput
        from .views.problems import damage_lines
        warn = _stderr(parser.prog)
        with for_stderr() as progress, Engine(args.jobs, args.dask) as engine:
            with progress.phase(f"reading {len(a.files) + len(b.files)} traces"):
                engine = _Counted(engine, progress)
                analysed = {name: analyse(run, engine) for name, run in (("A", a), ("B", b))}
                for name, analysis in analysed.items():
                    for line in damage_lines(analysis):
                        warn(f"run {name}: {line}")
                result = compare_runs(analysed["A"], analysed["B"], engine=engine)
        diff = DiffInput(result, top=args.top, say=_print)
        render_all(TERMINAL, diff, args.out)
        if args.out:
            with for_stderr() as progress:
                diff.progress = progress
                render_all(FILES, diff, args.out)
            _print(os.path.join(args.out, PAGE))
    except _errors() as exc:
        return _fail(parser.prog, _message(exc))
    return EXIT_UNREADABLE if analysed["A"].any_missing or analysed["B"].any_missing else 0


def report_console() -> int:
    """The ``trace-report`` console script: report_main, its bugs in one line."""
    return run_console("trace-report", report_main)


def diff_console() -> int:
    """The ``trace-diff`` console script."""
    return run_console("trace-diff", diff_main)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(report_console())
