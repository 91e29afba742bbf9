"""``trace-diff``: what changed between two runs (another parallel layout, schedule or code edit).

:func:`diff_runs` matches the runs by rank role (:mod:`viz.diff_roles`), profiles every rank
(:mod:`viz.diff_profile`: ops per module and phase, call-graph functions, communication per kind,
phase and group size, FLOPs, time metrics), compares matched roles and the totals over all
ranks, and builds diff call graphs (:mod:`viz.diff_graph`). :func:`format_table` prints the
largest changes; :func:`write_diff` writes ``diff.json`` (schema ``paratrace.diff/1``),
``diff.html`` and the diff call-graph SVGs. See docs/diff.md.

*Structure* is the exact multisets of ops per (module, op, phase), call-graph function nodes and
communication per (kind, phase, group size) of every role, and the set of roles: runs without a
difference there have "no structural change". FLOPs and bytes follow from recorded shapes and
are compared exactly too, but reported as sizes; time is always reported with both values and a
relative change, never as structure.
"""
from __future__ import annotations

import json
import math
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

from .callgraph import run_groups
from .diff_graph import build_diff_graph, prune_diff
from .diff_profile import TIME_METRICS, Profile, merge, rank_profile
from .diff_roles import assign_roles
from .source import display_paths
from .summary import comm_rows
from .trace import Run

SCHEMA = "paratrace.diff/1"
ALL_RANKS = "all ranks"
MAX_GRAPHS = 8        # diff call graphs drawn: all ranks, then the first roles


@dataclass(frozen=True)
class Delta:
    """One compared figure: ``a`` in the baseline, ``b`` in the changed run (None: not
    measured)."""

    scope: str          # "all ranks" or a role label
    category: str       # ops | flops | comm | comm bytes | time
    name: str
    a: Optional[float]
    b: Optional[float]
    unit: str           # count | flops | bytes | s | fraction

    @property
    def rel(self) -> Optional[float]:
        """(b - a) / a; None when a is 0 or either is unknown."""
        if self.a is None or self.b is None or self.a == 0:
            return None
        return (self.b - self.a) / abs(self.a)

    @property
    def size(self) -> float:
        """How large the change is, 0..1 (1: appeared or disappeared)."""
        if self.a is None or self.b is None or self.a == self.b:
            return 0.0
        return abs(self.b - self.a) / max(abs(self.a), abs(self.b))

    def to_json(self) -> dict:
        return {"scope": self.scope, "category": self.category, "name": self.name,
                "a": self.a, "b": self.b, "unit": self.unit, "rel": self.rel}


@dataclass
class ScopeDiff:
    """A matched rank role (or all ranks): both sides' profiles and what differs."""

    label: str
    a: Profile
    b: Profile
    ops: list = field(default_factory=list)        # ((module, op, phase), a, b) that differ
    functions: list = field(default_factory=list)  # (function key, a, b)
    comm: list = field(default_factory=list)       # ((kind, phase, size), a, b, bytes a, b)
    module_comm: list = field(default_factory=list)  # ((module, kind, phase), a, b)
    deltas: list = field(default_factory=list)     # Delta: op counts, FLOPs, comm, time

    @property
    def structural(self) -> bool:
        return bool(self.ops or self.functions or
                    any(ca != cb for _, ca, cb, _, _ in self.comm))

    @property
    def sizes_changed(self) -> bool:
        return any(d.category in ("flops", "comm bytes") and d.size for d in self.deltas)


@dataclass(frozen=True)
class RunSide:
    """What the diff says about one of the two runs."""

    dir: str
    world_size: int
    ranks: tuple
    config: dict
    steps: tuple


@dataclass
class DiffResult:
    """Everything :func:`diff_runs` found; renderers only format it."""

    a: RunSide
    b: RunSide
    role_method: str
    config_changes: list       # (key, a value, b value)
    roles: list                # ScopeDiff per matched role, in role order of run A
    only_a: list               # (role label, rank) with no counterpart in B
    only_b: list
    totals: ScopeDiff          # all ranks
    graphs: list               # DiffGraph: all ranks, then roles (at most MAX_GRAPHS)
    warnings: list = field(default_factory=list)

    @property
    def structural_change(self) -> bool:
        return bool(self.only_a or self.only_b or self.totals.structural
                    or any(r.structural for r in self.roles))

    def verdict(self) -> str:
        """One plain sentence: is the structure the same?"""
        if not self.structural_change:
            sizes = " FLOPs or communication bytes differ (tensor sizes changed)." \
                if self.totals.sizes_changed or any(r.sizes_changed for r in self.roles) \
                else " FLOPs and communication bytes are equal too."
            return (f"No structural change: on all {len(self.roles)} matched rank roles the "
                    "same ops per module and phase, the same call-graph functions and the same "
                    "communication per kind, phase and group size." + sizes +
                    " Times differ between any two runs and are shown with both values, not "
                    "as structure.")
        parts = []
        if self.a.world_size != self.b.world_size:
            parts.append(f"world size {self.a.world_size} -> {self.b.world_size}")
        if self.only_a:
            parts.append(f"{_plural(len(self.only_a), 'role')} only in A")
        if self.only_b:
            parts.append(f"{_plural(len(self.only_b), 'role')} only in B")
        changed = [r for r in self.roles if r.structural]
        if changed:
            parts.append(f"{len(changed)} of {len(self.roles)} matched roles differ")
        t = self.totals
        parts.append(f"over all ranks {len(t.ops)} (module, op, phase) keys, "
                     f"{len(t.functions)} call-graph functions and "
                     f"{sum(1 for c in t.comm if c[1] != c[2])} communication kinds differ")
        return "Structural change: " + "; ".join(parts) + "."


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


# ---------------------------------------------------------------------------- analysis
def _counter_changes(a: Counter, b: Counter) -> list:
    return [(k, a.get(k, 0), b.get(k, 0)) for k in sorted(set(a) | set(b), key=_sort_key)
            if a.get(k, 0) != b.get(k, 0)]


def _sort_key(key) -> tuple:
    return tuple(str(k) for k in key) if isinstance(key, tuple) else (str(key),)


def compare(label: str, a: Profile, b: Profile) -> ScopeDiff:
    """What differs between two profiles of the same scope."""
    out = ScopeDiff(label, a, b, _counter_changes(a.ops, b.ops),
                    _counter_changes(a.functions, b.functions),
                    module_comm=_counter_changes(a.module_comm, b.module_comm))
    for key in sorted(set(a.comm) | set(b.comm), key=_sort_key):
        row = (key, a.comm.get(key, 0), b.comm.get(key, 0), a.comm_bytes.get(key, 0),
               b.comm_bytes.get(key, 0))
        if row[1] != row[2] or row[3] != row[4]:
            out.comm.append(row)
    d = out.deltas
    for op in sorted(set(a.op_counts) | set(b.op_counts)):
        d.append(Delta(label, "ops", op, a.op_counts.get(op, 0), b.op_counts.get(op, 0),
                       "count"))
    for family in sorted(set(a.flops) | set(b.flops)):
        d.append(Delta(label, "flops", family, a.flops.get(family, 0), b.flops.get(family, 0),
                       "flops"))
    for (kind, phase, size) in sorted(set(a.comm) | set(b.comm), key=_sort_key):
        name = f"{kind} {phase} (group of {size})" if size else f"{kind} {phase}"
        key = (kind, phase, size)
        d.append(Delta(label, "comm", name, a.comm.get(key, 0), b.comm.get(key, 0), "count"))
        d.append(Delta(label, "comm bytes", name, a.comm_bytes.get(key, 0),
                       b.comm_bytes.get(key, 0), "bytes"))
    for metric in TIME_METRICS:
        d.append(Delta(label, "time", metric, a.time.get(metric), b.time.get(metric),
                       "s" if metric.endswith("_s") else "fraction"))
    return out


def _profiles(run: Run, groups: dict) -> tuple:
    """(rank -> Profile, display paths) of every readable rank."""
    from . import timeline     # the heavier analysis, loaded only when a diff is made
    metrics = timeline.run_metrics(run)
    paths = display_paths({f.file for gs in groups.values() for g in gs for f in g.path})
    out = {}
    for rank, trace in sorted(run.ranks.items()):
        steps = sorted(set(trace.col("step").tolist())) if len(trace) else []
        out[rank] = rank_profile(rank, groups[rank], comm_rows(trace), paths,
                                 metrics.get(rank), steps)
    return out, paths


def _side(run: Run, profiles: dict) -> RunSide:
    steps = tuple(sorted({s for p in profiles.values() for s in p.steps}))
    return RunSide(run.dir, run.world_size, tuple(sorted(run.ranks)), dict(run.config), steps)


def diff_runs(a: Run, b: Run) -> DiffResult:
    """Compare run ``b`` against the baseline ``a`` (both loaded with viz.trace.load_run)."""
    groups_a, groups_b = run_groups(a), run_groups(b)
    prof_a, paths_a = _profiles(a, groups_a)
    prof_b, paths_b = _profiles(b, groups_b)
    roles_a, roles_b, method = assign_roles(a.config, a.world_size, prof_a, b.config,
                                            b.world_size, prof_b)
    by_key_b = {role.key: rank for rank, role in roles_b.items()}
    matched, only_a = [], []
    for rank, role in sorted(roles_a.items()):
        if role.key in by_key_b:
            matched.append((role, rank, by_key_b[role.key]))
        else:
            only_a.append((role.label, rank))
    keys_a = {role.key for role in roles_a.values()}
    only_b = [(role.label, rank) for rank, role in sorted(roles_b.items())
              if role.key not in keys_a]
    roles = [compare(role.label, prof_a[ra], prof_b[rb]) for role, ra, rb in matched]
    totals = compare(ALL_RANKS, merge(list(prof_a.values())), merge(list(prof_b.values())))

    graphs = [build_diff_graph(ALL_RANKS, [g for r in sorted(groups_a) for g in groups_a[r]],
                               paths_a, [g for r in sorted(groups_b) for g in groups_b[r]],
                               paths_b)]
    for role, ra, rb in matched[:MAX_GRAPHS - 1]:
        graphs.append(build_diff_graph(role.label, groups_a[ra], paths_a, groups_b[rb], paths_b))

    side_a, side_b = _side(a, prof_a), _side(b, prof_b)
    warnings = []
    for name, run in (("A", a), ("B", b)):
        if run.missing:
            warnings.append(f"run {name} has no readable trace for ranks {run.missing}: they "
                            "are left out")
    if side_a.steps != side_b.steps:
        warnings.append(f"the runs recorded different steps (A {list(side_a.steps)}, B "
                        f"{list(side_b.steps)}): counts cover different numbers of iterations")
    keys = sorted(set(a.config) | set(b.config))
    changes = [(k, a.config.get(k), b.config.get(k)) for k in keys
               if a.config.get(k) != b.config.get(k)]
    return DiffResult(side_a, side_b, method, changes, roles, only_a, only_b, totals, graphs,
                      warnings)


# ---------------------------------------------------------------------------- terminal
def largest_changes(result: DiffResult) -> list:
    """Every non-time change over all scopes, largest first: communication, then FLOPs, then op
    counts, each biggest relative change first; a change seen alike on several roles is listed
    once (its scope says how many)."""
    seen: dict = {}
    for scope in [result.totals] + result.roles:
        for d in scope.deltas:
            if d.category == "time" or not d.size:
                continue
            key = (d.category, d.name, d.a, d.b)
            seen.setdefault(key, []).append(d)
    rows = []
    for alike in seen.values():
        first = alike[0]
        scope = first.scope if len(alike) == 1 else f"{first.scope} (+{len(alike) - 1} alike)"
        rows.append(Delta(scope, first.category, first.name, first.a, first.b, first.unit))
    # Communication first, then FLOPs, then op counts: a few rows of each kind say more than
    # many op counts that changed by the same factor.
    order = {"comm": 0, "comm bytes": 1, "flops": 2, "ops": 3}
    rows.sort(key=lambda d: (order.get(d.category, 9), -round(d.size, 6),
                             -abs((d.b or 0) - (d.a or 0)), d.scope, d.name))
    return rows


def fmt_value(value: Optional[float], unit: str) -> str:
    """A figure for the table and the page: counts exact, FLOPs/bytes/seconds shortened."""
    from .render import fmt_bytes, fmt_count, fmt_flops, fmt_time
    if value is None:
        return "-"
    if unit == "count":
        return fmt_count(value)
    if unit == "bytes":
        return fmt_bytes(value)
    if unit == "flops":
        return fmt_flops(value)
    if unit == "s":
        return fmt_time(value * 1e9)
    return f"{value:.3f}"


def fmt_rel(d: Delta) -> str:
    if d.a is None or d.b is None:
        return ""
    if d.a == 0:
        return "new" if d.b else "="
    if d.b == 0:
        return "gone"
    rel = d.rel
    if rel == 0:
        return "="
    factor = d.b / d.a
    if factor >= 2 or factor <= 0.5:
        return f"x{factor:.3g}"
    return f"{rel * 100:+.1f}%"


def _table(rows: list, header: tuple) -> list:
    widths = [max(len(str(r[i])) for r in [header] + rows) for i in range(len(header))]
    lines = []
    for r in [header] + rows:
        lines.append("  ".join(str(c).ljust(w) if i < 2 else str(c).rjust(w)
                               for i, (c, w) in enumerate(zip(r, widths))).rstrip())
    return lines


def format_table(result: DiffResult, top: int) -> str:
    """The terminal summary: the verdict, the ``top`` largest changes, the time metrics."""
    a, b = result.a, result.b
    lines = [f"A: {a.dir} ({a.world_size} ranks)", f"B: {b.dir} ({b.world_size} ranks)"]
    if result.config_changes:
        lines.append("config: " + ", ".join(f"{k} {va} -> {vb}"
                                            for k, va, vb in result.config_changes))
    lines.append(f"roles matched by {result.role_method.split(':')[0]}: {len(result.roles)}"
                 + (f", only in A: {len(result.only_a)}" if result.only_a else "")
                 + (f", only in B: {len(result.only_b)}" if result.only_b else ""))
    lines += [f"warning: {w}" for w in result.warnings]
    lines += ["", result.verdict(), ""]
    every = largest_changes(result)
    rows = every[:max(top, 0)]
    if rows:
        lines.append(f"Largest changes (communication, FLOPs, op counts; top {len(rows)} of "
                     f"{len(every)}):")
        lines += _table([(d.scope, f"{d.category}: {d.name}", fmt_value(d.a, d.unit),
                          fmt_value(d.b, d.unit), fmt_rel(d)) for d in rows],
                        ("scope", "what", "A", "B", "change"))
    elif every:
        lines.append(f"{len(every)} op count, FLOP or communication figures differ (--top 0).")
    else:
        lines.append("No op count, FLOP or communication figure differs.")
    lines += ["", "Time (mean over ranks; measured times differ on every run, never structure):"]
    lines += _table([(ALL_RANKS, d.name, fmt_value(d.a, d.unit), fmt_value(d.b, d.unit),
                      fmt_rel(d)) for d in result.totals.deltas if d.category == "time"],
                    ("scope", "metric", "A", "B", "change"))
    return "\n".join(lines)


# ---------------------------------------------------------------------------- files
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
            "comm": [{"kind": k[0], "phase": k[1], "group_size": k[2], "a_count": ca,
                      "b_count": cb, "a_bytes": ba, "b_bytes": bb}
                     for k, ca, cb, ba, bb in s.comm],
            "deltas": [d.to_json() for d in s.deltas if d.size or d.category == "time"],
        }
    return {
        "schema": SCHEMA, "a": side(result.a), "b": side(result.b),
        "structural_change": result.structural_change, "verdict": result.verdict(),
        "role_method": result.role_method,
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


def write_diff(result: DiffResult, a: Run, b: Run, out_dir: str) -> str:
    """Write diff.json, the diff call-graph SVGs and diff.html into ``out_dir``; returns the
    path of diff.html. Raises viz.render.callgraph_svg.RenderError if graphviz fails."""
    from .diff_page import write_page
    from .render.diff_svg import diff_svgs
    os.makedirs(out_dir, exist_ok=True)
    svgs = diff_svgs([prune_diff(g) for g in result.graphs], a.dir, b.dir)
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

