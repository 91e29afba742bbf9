"""diff.json (schema ``paratrace.diff/1``, docs/diff.md) and the files beside it: a
:class:`viz.diff.result.DiffResult` written as JSON, its diff call graphs as SVG
(:mod:`.diff_svg`) and the page that shows them (:mod:`.diff_html`)."""
from __future__ import annotations

import json
import math
import os
from typing import Optional

from ..diff.graph import prune_diff
from ..diff.result import Delta, DiffResult, RunSide, ScopeDiff
from .diff_html import write_page
from .diff_svg import diff_svgs

SCHEMA = "paratrace.diff/1"


def delta_json(d: Delta) -> dict:
    """One of a scope's ``deltas``."""
    return {"scope": d.scope, "category": d.category, "name": d.name, "a": d.a, "b": d.b,
            "unit": d.unit, "rel": d.rel}


def to_json(result: DiffResult, svgs: Optional[dict] = None) -> dict:
    """diff.json (schema paratrace.diff/1, docs/diff.md)."""
    def side(s: RunSide) -> dict:
        return {"dir": s.dir, "world_size": s.world_size, "ranks": list(s.ranks),
                "config": s.config, "steps": list(s.steps)}

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
            "deltas": [delta_json(d) for d in s.deltas if d.size or d.category == "time"],
        }
    return {
        "schema": SCHEMA, "a": side(result.a), "b": side(result.b),
        "structural_change": result.structural_change, "verdict": result.verdict(),
        "in_words": result.in_words,
        "role_method": result.role_method, "compared_steps": list(result.compared_steps),
        "config_changes": [{"key": k, "a": va, "b": vb} for k, va, vb in result.config_changes],
        "only_a": [{"role": label, "rank": r} for label, r in result.only_a],
        "only_b": [{"role": label, "rank": r} for label, r in result.only_b],
        "totals": scope(result.totals), "roles": [scope(r) for r in result.roles],
        "graphs": [{"scope": g.scope, "nodes": g.counts(), "svg": (svgs or {}).get(g.scope)}
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


def write_diff(result: DiffResult, out_dir: str) -> str:
    """Write diff.json, the diff call-graph SVGs and diff.html into ``out_dir``; returns the
    path of diff.html. Raises :class:`.callgraph_svg.RenderError` if graphviz fails."""
    os.makedirs(out_dir, exist_ok=True)
    svgs = diff_svgs([prune_diff(g) for g in result.graphs], result.a.dir, result.b.dir)
    files = {}
    for i, (scope, svg) in enumerate(svgs.items()):
        name = "diff-callgraph.svg" if i == 0 else f"diff-callgraph-{i}.svg"
        with open(os.path.join(out_dir, name), "w", encoding="utf-8") as fh:
            fh.write(svg)
        files[scope] = name
    data = _finite(to_json(result, files))
    with open(os.path.join(out_dir, "diff.json"), "w") as fh:
        json.dump(data, fh, indent=1)
    return write_page(result, files, svgs, out_dir)

