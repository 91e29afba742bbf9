"""``trace-diff``: what changed between two runs (another parallel layout, schedule or code edit).

:func:`diff_runs` analyses both runs once (:mod:`viz.analysis`), matches them by rank role
(:mod:`viz.diff.roles`), profiles every rank (:mod:`viz.diff.profile`: ops per module and phase,
call-graph functions, communication per kind, phase and process group, FLOPs, time metrics),
compares matched roles and the totals over all ranks (:mod:`viz.diff.result`), and builds diff
call graphs (:mod:`viz.diff.graph`). :func:`format_table` (:mod:`viz.render.diff_text`) prints
the largest changes; :func:`write_diff` writes ``diff.json`` (schema ``paratrace.diff/1``),
``diff.html`` and the diff call-graph SVGs. See docs/diff.md.

*Structure* is the exact multisets of ops per (module, op, phase), call-graph function nodes and
communication per (kind, phase, process group) of every role, and the set of roles: runs without a
difference there have "no structural change". FLOPs and bytes follow from recorded shapes and
are compared exactly too, but reported as sizes; time is always reported with both values and a
relative change, never as structure.
"""
from __future__ import annotations

import json
import math
import os
from typing import Callable, Optional

from ..analysis.run_analysis import RunAnalysis, analyse, recount
from ..engine import Engine
from ..render.diff_html import write_page
from ..render.diff_svg import diff_svgs
from ..render.diff_text import format_table
from ..run import Run
from ..analysis.source import display_paths
from .graph import build_diff_graph, prune_diff
from .profile import merge, rank_profile
from .result import ALL_RANKS, DiffResult, RunSide, ScopeDiff, compare
from ..analysis.grid import grid_of
from .roles import assign_roles, group_label, match_roles
from .words import describe

SCHEMA = "paratrace.diff/1"
MAX_GRAPHS = 8        # diff call graphs drawn: all ranks, then roles that changed first
# viz.cli calls diff_runs, format_table and write_diff of this package.
__all__ = ["diff_runs", "format_table", "write_diff", "to_json", "DiffResult"]


def recorded_steps(analysis: RunAnalysis) -> frozenset:
    """Every step index some rank of the run recorded."""
    return frozenset(s for mine in analysis.ranks.values() for s in mine.steps)


def _profiles(analysis: RunAnalysis, grid: Optional[tuple]) -> tuple:
    """(rank -> Profile, display paths) of every readable rank, process groups named along
    ``grid``."""
    groups = {rank: mine.op_groups for rank, mine in analysis.ranks.items()}
    paths = display_paths({f.file for gs in groups.values() for g in gs for f in g.path})
    out = {rank: rank_profile(rank, mine.op_groups, mine.comm, paths, analysis.metrics.get(rank),
                              mine.steps, lambda ranks: group_label(ranks, grid))
           for rank, mine in sorted(analysis.ranks.items())}
    return out, paths


def _side(analysis: RunAnalysis, steps: frozenset) -> RunSide:
    return RunSide(analysis.run.dir, analysis.world_size, tuple(sorted(analysis.ranks)),
                   dict(analysis.config), tuple(sorted(steps)))


def diff_runs(run_a: Run, run_b: Run, *, warn: Optional[Callable[[str], None]] = None,
              engine: Optional[Engine] = None) -> DiffResult:
    """Compare run ``b`` against the baseline ``a`` (both opened with viz.run.open_run). Each
    damaged or missing trace goes to ``warn`` as one line; per-rank work runs on ``engine``."""
    a, b = analyse(run_a, engine), analyse(run_b, engine)
    for name, analysis in (("A", a), ("B", b)):
        for line in analysis.damage():
            if warn is not None:
                warn(f"run {name}: {line}")
    steps_a, steps_b = recorded_steps(a), recorded_steps(b)
    # Counts are only comparable over the same iterations (trace-run --steps 1- leaves out the
    # setup of step 0, a longer run has more steps): compare the steps both recorded.
    common = steps_a & steps_b if steps_a != steps_b and steps_a & steps_b else None
    if common:
        a, b = recount(a, common, engine), recount(b, common, engine)
    roles_a, roles_b, method = assign_roles(a.config, a.world_size, a.ranks, b.config,
                                            b.world_size, b.ranks)
    # Groups are named by grid axes only when both runs have a grid, as roles are.
    grids = (grid_of(a.config, a.world_size), grid_of(b.config, b.world_size))
    if not all(grids):
        grids = (None, None)
    prof_a, paths_a = _profiles(a, grids[0])
    prof_b, paths_b = _profiles(b, grids[1])
    matched, only_a, only_b = match_roles(roles_a, roles_b)
    roles = [compare(role.label, prof_a[ra], prof_b[rb]) for role, ra, rb in matched]
    totals = compare(ALL_RANKS, merge(list(prof_a.values())), merge(list(prof_b.values())))

    def merged(analysis):
        return [g for r in sorted(analysis.ranks) for g in analysis.ranks[r].op_groups]

    graphs = [build_diff_graph(ALL_RANKS, merged(a), paths_a, merged(b), paths_b)]
    # Roles whose structure (then sizes) changed are drawn first: with many roles, the first
    # few by rank are often the unchanged ones.
    drawn = sorted(zip(matched, roles), key=lambda m: (not m[1].structural,
                                                       not m[1].sizes_changed))
    for (role, ra, rb), _ in drawn[:MAX_GRAPHS - 1]:
        graphs.append(build_diff_graph(role.label, a.ranks[ra].op_groups, paths_a,
                                       b.ranks[rb].op_groups, paths_b))

    keys = sorted(set(a.config) | set(b.config))
    changes = [(k, a.config.get(k), b.config.get(k)) for k in keys
               if a.config.get(k) != b.config.get(k)]
    return DiffResult(_side(a, steps_a), _side(b, steps_b), method, changes, roles, only_a,
                      only_b, totals, graphs, _warnings(a, b, steps_a, steps_b, common),
                      tuple(sorted(common or steps_a | steps_b)),
                      unreadable=[("A", r) for r in a.missing] + [("B", r) for r in b.missing],
                      in_words=describe(totals))


def _warnings(a: RunAnalysis, b: RunAnalysis, steps_a: frozenset, steps_b: frozenset,
              common: Optional[frozenset]) -> list:
    """What makes the comparison partial: unreadable ranks, different recorded steps."""
    out = []
    for name, analysis in (("A", a), ("B", b)):
        if analysis.missing:
            out.append(f"run {name} has no readable trace for ranks {analysis.missing}: they "
                       "are left out")
    if common:
        out.append(f"the runs recorded different steps (A {sorted(steps_a)}, B "
                   f"{sorted(steps_b)}): ops, FLOPs and communication are compared over the "
                   f"steps both recorded, {sorted(common)}")
    elif steps_a != steps_b:
        out.append(f"the runs recorded no step in common (A {sorted(steps_a)}, B "
                   f"{sorted(steps_b)}): counts cover different iterations")
    return out


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
            "deltas": [d.to_json() for d in s.deltas if d.size or d.category == "time"],
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
    path of diff.html. Raises viz.render.callgraph_svg.RenderError if graphviz fails."""
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

