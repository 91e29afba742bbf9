"""summary.json: the machine-readable digest of a run (schema ``paratrace.summary/1``).

The contract is DESIGN.md's; tests and scripts read it, so keys keep their meaning and new keys
are only added. Per rank: status, event count, op counts (in all and per phase), communication
aggregated by (kind, phase, group), and the timeline's time metrics. Ranks of the world with no
trace file and nothing in run.json are ``missing_ranks``, runs of ``[first, last]``, instead of
an entry each. A pure function of a :class:`viz.analysis.RunAnalysis`; the report takes the
same dict rather than reading the file.
"""
from __future__ import annotations

import json
import os

from tracer import rundir

from ..analysis.run_analysis import RunAnalysis

SCHEMA = "paratrace.summary/1"
TIME_KEYS = ("wall_s", "compute_s", "comm_s", "exposed_comm_s", "idle_s", "overlap_fraction",
             "bubble_fraction")


def build_summary(analysis: RunAnalysis) -> dict:
    """The summary dict of an analysed run."""
    ranks = {}
    for rank in analysis.listed():
        entry = {"status": analysis.status(rank)}
        mine = analysis.ranks.get(rank)
        if mine is not None:
            metrics = analysis.metrics.get(rank)
            time = metrics.to_json() if metrics else {k: None for k in TIME_KEYS}
            time["clock"] = mine.lanes.clock
            entry.update(events=mine.events, op_counts=mine.op_counts,
                         op_counts_by_phase=mine.op_counts_by_phase, comm=mine.comm,
                         time=time, clock_error_ns=mine.lanes.clock_error_ns, steps=mine.steps)
            if mine.device is not None:
                entry["device"] = mine.device
            if mine.warnings:
                entry["warnings"] = mine.warnings
        else:
            entry.update(events=0, op_counts={}, op_counts_by_phase={}, comm=[],
                         time={k: None for k in TIME_KEYS})
        error = analysis.error(rank) if entry["status"] != "ok" else None
        if error:
            entry["error"] = error
        if mine is not None and entry["status"] != "ok" and mine.last_op:
            entry["last_op"] = mine.last_op
        ranks[str(rank)] = entry
    # the other ranks of the world have no trace file and nothing recorded: runs of them,
    # not an entry each (a world of a million beside 2 traces stays a small file)
    return {"schema": SCHEMA, "world_size": analysis.world_size, "config": analysis.config,
            "command": analysis.run.info.get("command"), "ranks": ranks,
            "missing_ranks": [list(pair) for pair in analysis.unlisted()],
            "cross_rank": dict(analysis.cross.to_json(),
                               critical_path=[p.to_json() for p in analysis.paths])}


def write_summary(summary: dict, out_dir: str) -> str:
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, rundir.SUMMARY)
    with open(path, "w") as fh:
        json.dump(summary, fh, indent=1)
    return path
