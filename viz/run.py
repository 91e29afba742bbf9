"""A run directory: where its traces are and what trace-run recorded about the run.

A run directory (``trace-run --out DIR``) holds ``DIR/traces/rank-<R>.arrow`` (one per rank),
their live status files, and ``DIR/run.json`` (written by trace-run: command, exit codes, hang
report); a bare directory of ``rank-<R>.arrow`` files (what ``tracer.trace(dir)`` writes) opens
too (file names: :mod:`tracer.rundir`). Opening a run reads no trace: analyses load one rank's
trace at a time (:mod:`viz.analysis`), so a run of many ranks never sits in memory whole.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import tracer
from tracer import Trace, rundir


class RunError(Exception):
    """A run directory that cannot be used; the message is one line naming it."""


@dataclass
class Run:
    """The trace files of one run, and its run.json."""

    dir: str
    traces_dir: str
    files: dict                                     # rank -> trace file path
    info: dict = field(default_factory=dict)        # run.json, {} when absent

    @property
    def world_size_hint(self) -> int:
        """The world size known without reading a trace: run.json's, or the highest rank file."""
        return max([self.info.get("world_size") or 0, max(self.files) + 1])

    def load(self, rank: int) -> Trace:
        """Read one rank's trace. Raises tracer.TraceError (one line naming the file)."""
        return tracer.load(self.files[rank])


def open_run(path: str) -> Run:
    """Open a run directory. Raises RunError if it is not one or holds no trace file."""
    if not os.path.isdir(path):
        raise RunError(f"{path}: not a directory" if os.path.exists(path)
                       else f"{path}: no such run directory")
    traces_dir = rundir.traces_dir(path)
    try:
        files = rundir.rank_files(traces_dir)
    except OSError as exc:
        raise RunError(f"{traces_dir}: cannot list the traces ({exc.strerror})") from None
    info = {}
    info_path = os.path.join(path, rundir.RUN_RECORD)
    if os.path.exists(info_path):
        try:
            with open(info_path) as fh:
                info = json.load(fh)
        except (OSError, ValueError) as exc:
            raise RunError(f"{info_path}: unreadable run record ({exc})") from None
        if not isinstance(info, dict):
            raise RunError(f"{info_path}: unreadable run record (not a JSON object)")
    if not files:
        raise RunError(f"{path}: no trace files (rank-<R>.arrow) found")
    return Run(os.path.abspath(path), traces_dir, dict(sorted(files.items())), info)
