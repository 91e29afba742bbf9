"""The records of a diff and the comparison of two profiles of the same scope.

A :class:`DiffResult` holds everything viz.diff found about two runs: per matched rank role (and
over all ranks) a :class:`ScopeDiff` with both profiles, the structural keys that differ and a
:class:`Delta` for every compared figure. Views (viz.views.diff_table) and renderers
(viz.render.diff) only format these records.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

from ..analysis.crossrank.dimensions import dimension_label
from .cost import Cost, cost_of
from .profile import TIME_METRICS, Profile

ALL_RANKS = "all ranks"    # the scope of the totals over every rank


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


@dataclass
class ScopeDiff:
    """A matched rank role (or all ranks): both sides' profiles and what differs."""

    label: str
    a: Profile
    b: Profile
    ops: list = field(default_factory=list)        # ((module, op, phase), a, b) that differ
    functions: list = field(default_factory=list)  # (function key, a, b)
    comm: list = field(default_factory=list)       # ((kind, phase, group), a, b, bytes a, b)
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
    steps: tuple                # every step it recorded
    wrappers: tuple = ()        # wrappers taken off its module paths (tracer.vocab.model_paths)


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
    compared_steps: tuple = ()  # the steps every figure covers; () for each run's own
    in_words: list = field(default_factory=list)     # communication changes, as sentences
    matched_files: list = field(default_factory=list)  # viz.diff.files.FileMatch

    @property
    def cost(self) -> tuple[Cost, Cost]:
        """(A's, B's) cost per step over all ranks (:mod:`.cost`)."""
        return cost_of(self.totals.a), cost_of(self.totals.b)

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
                    "communication per kind, phase and process group." + sizes +
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
        kinds = sorted({key[0] for key, ca, cb, _, _ in t.comm if ca != cb})
        parts.append(f"over all ranks {len(t.ops)} (module, op, phase) keys and "
                     f"{len(t.functions)} call-graph functions differ")
        if kinds:
            parts.append("calls differ in " + ", ".join(k.replace("_", "-") for k in kinds))
        return "Structural change: " + "; ".join(parts) + "."


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


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
    for (kind, phase, group) in sorted(set(a.comm) | set(b.comm), key=_sort_key):
        name = f"{kind} {phase} ({group})"
        key = (kind, phase, group)
        d.append(Delta(label, "comm", name, a.comm.get(key, 0), b.comm.get(key, 0), "count"))
        d.append(Delta(label, "comm bytes", name, a.comm_bytes.get(key, 0),
                       b.comm_bytes.get(key, 0), "bytes"))
    # a dimension is named with the user's names of its groups in either run beside it
    named = {dim: dimension_label(dim, sorted(n for d, n in a.dim_names | b.dim_names if d == dim))
             for dim in set(a.dim_calls) | set(b.dim_calls) | {d for d, _ in a.dim_time}
             | {d for d, _ in b.dim_time}}
    for dim in sorted(set(a.dim_calls) | set(b.dim_calls)):
        d.append(Delta(label, "dimension", named[dim], a.dim_calls.get(dim, 0),
                       b.dim_calls.get(dim, 0), "count"))
        d.append(Delta(label, "dimension bytes", named[dim], a.dim_bytes.get(dim, 0),
                       b.dim_bytes.get(dim, 0), "bytes"))
    for metric in TIME_METRICS:
        d.append(Delta(label, "time", metric, a.time.get(metric), b.time.get(metric),
                       "s" if metric.endswith("_s") else "fraction"))
    for dim, what in sorted(set(a.dim_time) | set(b.dim_time)):
        d.append(Delta(label, "time", f"{what[:-2]} comm, {named[dim]}",
                       a.dim_time.get((dim, what), 0.0), b.dim_time.get((dim, what), 0.0), "s"))
    return out


