"""trace-diff's words: its largest changes, each figure and change as text, and the terminal
table (the verdict, the largest changes, the time metrics) that
:mod:`viz.render.diff.text` prints and diff.html (:mod:`viz.render.diff.html`) shows in part."""
from __future__ import annotations

from typing import Optional

from ..diff.result import ALL_RANKS, Delta, DiffResult
from .formatters import fmt_bytes, fmt_count, fmt_flops, fmt_time


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
    # Communication first (by group, then by parallel dimension), then FLOPs, then op counts: a few rows of each kind say more than
    # many op counts that changed by the same factor.
    order = {"comm": 0, "comm bytes": 1, "dimension": 2, "dimension bytes": 3, "flops": 4,
             "ops": 5}
    rows.sort(key=lambda d: (order.get(d.category, 9), -round(d.size, 6),
                             -abs((d.b or 0) - (d.a or 0)), d.scope, d.name))
    return rows


def fmt_value(value: Optional[float], unit: str) -> str:
    """A figure for the table and the page: counts exact, FLOPs/bytes/seconds shortened."""
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
    if result.in_words:
        lines += ["In words:"] + [f"  - {sentence}" for sentence in result.in_words] + [""]
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
