"""summary.json: the machine-readable digest of a run (schema ``paratrace.summary/1``).

The contract is DESIGN.md's; tests and scripts read it, so keys keep their meaning and new keys
are only added. Per rank: status, event count, op counts, communication aggregated by
(kind, phase, group), and the timeline's time metrics.
"""
from __future__ import annotations

import json
import os
from collections import defaultdict

import numpy as np

from tracer import rundir
from tracer.labels import PHASES
from tracer.ops import PSEUDO_OPS

from .trace import Run

SCHEMA = "paratrace.summary/1"
TIME_KEYS = ("wall_s", "compute_s", "comm_s", "exposed_comm_s", "idle_s", "overlap_fraction",
             "bubble_fraction")


def op_counts(trace) -> dict:
    """Dispatched ops by overload name (the tracer's pseudo-ops left out)."""
    names = trace.dictionary("op")
    counts = np.bincount(trace.col("op"), minlength=len(names)) if len(trace) else \
        np.zeros(len(names), dtype=np.int64)
    return {name: int(n) for name, n in zip(names, counts) if n and name not in PSEUDO_OPS}


def comm_rows(trace) -> list:
    """Collectives and P2P aggregated by (kind, phase, group): count and bytes."""
    kind, group = trace.col("kind"), trace.col("group")
    mask = kind >= 0
    if not mask.any():
        return []
    kinds, groups = trace.dictionary("kind"), trace.dictionary("group")
    phase, nbytes = trace.col("phase")[mask], trace.col("bytes")[mask]
    totals = defaultdict(lambda: [0, 0])
    for k, p, g, b in zip(kind[mask].tolist(), phase.tolist(), group[mask].tolist(),
                          nbytes.tolist()):
        entry = totals[(k, p, g)]
        entry[0] += 1
        entry[1] += max(b, 0)
    rows = []
    for (k, p, g), (count, total) in sorted(totals.items(), key=lambda kv: (
            kinds[kv[0][0]], kv[0][1], groups[kv[0][2]])):
        text = groups[g]
        ranks = [int(r) for r in text.split(",")] if text and not text.startswith("?") else []
        rows.append({"kind": kinds[k], "phase": PHASES[p], "group": ranks, "count": count,
                     "bytes": total})
    return rows


def _time_metrics(run: Run) -> dict:
    from . import timeline    # the timeline analysis fills the time fields
    return {rank: m.to_json() for rank, m in timeline.run_metrics(run).items()}


def build_summary(run: Run) -> dict:
    """The summary dict of a loaded run."""
    times = _time_metrics(run)
    ranks = {}
    for rank in range(run.world_size):
        entry = {"status": run.status(rank)}
        trace = run.ranks.get(rank)
        if trace is not None:
            entry.update(events=len(trace), op_counts=op_counts(trace), comm=comm_rows(trace),
                         time=times.get(rank) or {k: None for k in TIME_KEYS},
                         clock_error_ns=trace.clock_error_ns, steps=_steps(trace))
            if trace.warnings:
                entry["warnings"] = trace.warnings
        else:
            entry.update(events=0, op_counts={}, comm=[], time={k: None for k in TIME_KEYS})
        error = run.error(rank) if entry["status"] != "ok" else None
        if error:
            entry["error"] = error
        last = _last_op(trace) if trace is not None and entry["status"] != "ok" else None
        if last:
            entry["last_op"] = last
        ranks[str(rank)] = entry
    return {"schema": SCHEMA, "world_size": run.world_size, "config": run.config,
            "command": run.info.get("command"), "ranks": ranks}


def _steps(trace) -> list:
    steps = trace.col("step")
    return sorted(set(np.unique(steps).tolist())) if len(steps) else []


def _last_op(trace) -> dict:
    """What a failed rank was doing: its last recorded op, where, and its last collective."""
    out = {}
    ops = trace.dictionary("op")
    codes = trace.col("op")
    real = np.nonzero(~np.isin(codes, [trace.code("op", name) for name in PSEUDO_OPS]))[0]
    if len(real):
        i = int(real[-1])
        out["op"] = ops[codes[i]]
        stack = trace.stack(int(trace.col("stack")[i]))
        if stack:
            out["where"] = f"{stack[0][0]}:{stack[0][1]}"
    comm = np.nonzero(trace.col("kind") >= 0)[0]
    if len(comm):
        i = int(comm[-1])
        group = trace.dictionary("group")[trace.col("group")[i]]
        out["collective"] = {"kind": trace.dictionary("kind")[trace.col("kind")[i]],
                             "group": group, "seq": int(trace.col("seq")[i]),
                             "completed": bool(trace.col("t1")[i] >= 0)}
    return out


def write_summary(run: Run, out_dir: str) -> str:
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, rundir.SUMMARY)
    with open(path, "w") as fh:
        json.dump(build_summary(run), fh, indent=1)
    return path
