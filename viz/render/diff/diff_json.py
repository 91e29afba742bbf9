"""diff.json (schema ``paratrace.diff/1``, docs/diff.md): a :class:`viz.diff.result.DiffResult`
written as JSON, every key spelled here, with the names of its diff call graphs' files
(:mod:`.diff_callgraphs`)."""
from __future__ import annotations

import json
import math
import os
from typing import TYPE_CHECKING

from ...diff.cost import Cost
from ...diff.result import Delta, DiffResult, RunSide, ScopeDiff

if TYPE_CHECKING:
    from . import DiffInput

SCHEMA = "paratrace.diff/1"
PHASE = "drawing the diff call graphs"


def _delta(d: Delta) -> dict:
    """One of a scope's ``deltas``."""
    return {"scope": d.scope, "category": d.category, "name": d.name, "a": d.a, "b": d.b,
            "unit": d.unit, "rel": d.rel}


def _cost(c: Cost) -> dict:
    """One run's ``cost``: per step over the compared steps."""
    memory = None if c.memory is None else {"rank": c.memory.rank,
                                            "peak_bytes": c.memory.peak_bytes,
                                            "by_category": c.memory.by_category}
    return {"steps": c.steps, "step_s": c.step_s, "compute_s": c.compute_s,
            "exposed_comm_s": c.exposed_comm_s,
            "exposed_comm_s_by_dimension": c.exposed_by_dimension, "memory": memory}


def _document(result: DiffResult, svgs: dict) -> dict:
    """diff.json's object; ``svgs``: scope -> its SVG file."""
    def side(s: RunSide) -> dict:
        return {"dir": s.dir, "world_size": s.world_size, "ranks": list(s.ranks),
                "config": s.config, "steps": list(s.steps), "wrappers": list(s.wrappers)}

    def scope(s: ScopeDiff) -> dict:
        return {
            "scope": s.label, "a_ranks": list(s.a.ranks), "b_ranks": list(s.b.ranks),
            "structural_change": s.structural,
            "ops": [{"module": k[0], "op": k[1], "phase": k[2], "a": va, "b": vb}
                    for k, va, vb in s.ops],
            "functions": [{"function": k, "a": va, "b": vb} for k, va, vb in s.functions],
            "module_comm": [{"module": k[0], "kind": k[1], "phase": k[2], "a": va, "b": vb}
                            for k, va, vb in s.module_comm],
            "comm": [{"kind": k[0], "phase": k[1], "group": k[2], "a_count": ca,
                      "b_count": cb, "a_bytes": ba, "b_bytes": bb}
                     for k, ca, cb, ba, bb in s.comm],
            "deltas": [_delta(d) for d in s.deltas if d.size or d.category == "time"],
        }
    return {
        "schema": SCHEMA, "a": side(result.a), "b": side(result.b),
        "structural_change": result.structural_change, "verdict": result.verdict(),
        "in_words": result.in_words,
        "role_method": result.role_method, "compared_steps": list(result.compared_steps),
        "cost": dict(zip("ab", map(_cost, result.cost))),
        "matched_files": [{"a": m.a, "b": m.b, "shared": m.shared}
                          for m in result.matched_files],
        "config_changes": [{"key": k, "a": va, "b": vb} for k, va, vb in result.config_changes],
        "only_a": [{"role": label, "rank": r} for label, r in result.only_a],
        "only_b": [{"role": label, "rank": r} for label, r in result.only_b],
        "totals": scope(result.totals), "roles": [scope(r) for r in result.roles],
        "graphs": [{"scope": g.scope, "nodes": g.counts(), "svg": svgs.get(g.scope)}
                   for g in result.graphs],
        "warnings": result.warnings,
    }


def _finite(obj):
    """JSON without NaN/Infinity (strict parsers reject them)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_finite(v) for v in obj]
    return obj


def render(diff: DiffInput, report_dir: str) -> list:
    """Write ``report_dir/diff.json``; its path."""
    os.makedirs(report_dir, exist_ok=True)
    path = os.path.join(report_dir, "diff.json")
    with open(path, "w") as fh:
        json.dump(_finite(_document(diff.result, diff.svg_files)), fh, indent=1)
    return [path]
