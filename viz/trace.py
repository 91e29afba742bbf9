"""Loading a whole run: every rank's trace plus what trace-run recorded about the run.

A run directory (``trace-run --out DIR``) holds ``DIR/traces/rank-<R>.arrow`` (one per rank),
``DIR/traces/rank-<R>.status.json`` (the tracer's live status), and ``DIR/run.json`` (written by
trace-run: command, exit codes, hang report). A bare directory of ``rank-<R>.arrow`` files (what
``tracer.trace(dir)`` writes) loads too.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Optional

import tracer
from tracer import TraceError, rundir



class RunError(Exception):
    """A run directory that cannot be used; the message is one line naming it."""


@dataclass
class Run:
    """Every readable rank of one run. Analyses take a Run (or one of its Traces)."""

    dir: str
    traces_dir: str
    ranks: dict                       # rank -> Trace
    info: dict = field(default_factory=dict)        # run.json, {} when absent
    problems: dict = field(default_factory=dict)    # rank -> one-line reason it is unreadable
    world_size: int = 0

    @property
    def missing(self) -> list:
        """Ranks of the world with no readable trace."""
        return [r for r in range(self.world_size) if r not in self.ranks]

    def status(self, rank: int) -> str:
        """ok | failed | missing (DESIGN.md's summary.json statuses)."""
        if rank not in self.ranks:
            return "missing"
        reported = (self.info.get("ranks") or {}).get(str(rank)) or {}
        if reported.get("status") == "failed" or (reported.get("exit_code") not in (None, 0)):
            return "failed"
        return "ok" if self.ranks[rank].status == "ok" else "failed"

    def error(self, rank: int) -> Optional[str]:
        """Why a rank failed, as recorded by the tracer or trace-run."""
        reported = (self.info.get("ranks") or {}).get(str(rank)) or {}
        if reported.get("error"):
            return reported["error"]
        if rank in self.ranks:
            t = self.ranks[rank]
            if t.meta.get("error"):
                return t.meta["error"]
            if t.status == "running":
                return "the rank ended without closing its trace (killed?)"
        return self.problems.get(rank)

    @property
    def config(self) -> dict:
        """Run configuration recorded by the script (tracer.record_config), from the first rank."""
        for rank in sorted(self.ranks):
            if self.ranks[rank].config:
                return self.ranks[rank].config
        return {}


def trace_files(path: str) -> dict:
    """rank -> trace file path, from a run directory or a bare directory of traces."""
    if not os.path.isdir(path):
        raise RunError(f"{path}: not a directory")
    return rundir.rank_files(rundir.traces_dir(path))


def load_run(path: str) -> Run:
    """Load a run directory. Raises RunError if it holds no trace at all."""
    files = trace_files(path)
    traces_dir = rundir.traces_dir(path)
    info = {}
    info_path = os.path.join(path, rundir.RUN_RECORD)
    if os.path.exists(info_path):
        try:
            with open(info_path) as fh:
                info = json.load(fh)
        except (OSError, ValueError) as exc:
            raise RunError(f"{info_path}: unreadable run record ({exc})") from None
    if not files:
        raise RunError(f"{path}: no trace files (rank-<R>.arrow) found")
    ranks, problems = {}, {}
    for rank, file in sorted(files.items()):
        try:
            ranks[rank] = tracer.load(file)
        except TraceError as exc:
            problems[rank] = str(exc)
    if not ranks:
        raise RunError(f"{path}: no readable trace: " + "; ".join(problems.values()))
    world = max([info.get("world_size") or 0] + [t.world_size for t in ranks.values()]
                + [max(files) + 1])
    return Run(os.path.abspath(path), traces_dir, ranks, info, problems, world)
