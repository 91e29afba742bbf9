"""A run directory: where its traces are and what trace-run recorded about the run.

A run directory (``trace-run --out DIR``) holds ``DIR/traces/rank-<R>.arrow`` (one per rank),
their live status files, and ``DIR/run.json`` (written by trace-run: command, exit codes, each
rank's failure as facts, hang report); a bare directory of ``rank-<R>.arrow`` files (what
``tracer.trace(dir)`` writes) opens too (file names: :mod:`tracer.files.rundir`; run.json is
read by :mod:`tracer.files.run_record`). Opening a run reads no trace: analyses load one rank's
trace at a time (:mod:`viz.analysis`), so a run of many ranks never sits in memory whole.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from tracer.files import run_record, rundir
from tracer.files.reader import Trace, load


class RunError(Exception):
    """A run directory that cannot be used; the message is one line naming it."""


@dataclass
class Run:
    """The trace files of one run, and its run.json."""

    dir: str
    traces_dir: str
    files: dict[int, str]                           # rank -> trace file path
    info: run_record.RunRecord = field(default_factory=run_record.RunRecord)   # {}: none

    def load(self, rank: int) -> Trace:
        """Read one rank's trace. Raises tracer.TraceError (one line naming the file)."""
        return load(self.files[rank])


def open_run(path: str) -> Run:
    """Open a run directory. Raises RunError if it is not one or holds no trace file."""
    if not os.path.isdir(path):
        raise RunError(f"{path}: not a directory" if os.path.exists(path)
                       else f"{path}: no such run directory")
    sub = os.path.join(path, rundir.TRACES)
    if os.path.exists(sub) and not os.path.isdir(sub):
        raise RunError(f"{sub}: not a directory (a run's traces go there)")
    traces_dir = rundir.traces_dir(path)
    try:
        files = rundir.rank_files(traces_dir)
    except OSError as exc:
        raise RunError(f"{traces_dir}: cannot list the traces ({exc.strerror})") from None
    try:
        info = run_record.read(path)
    except run_record.RunRecordError as exc:
        raise RunError(str(exc)) from None
    if not files:
        raise RunError(f"{path}: no trace files (rank-<R>.arrow) found")
    # absolute: worker processes and Dask workers open the files from directories of their own
    return Run(os.path.abspath(path), os.path.abspath(traces_dir),
               {rank: os.path.abspath(file) for rank, file in sorted(files.items())}, info)
