"""trace-diff's words: its largest changes, each figure and change as text, and the terminal
table (the verdict, the largest changes, the time metrics) that
:mod:`viz.render.diff.terminal_table` prints and diff.html (:mod:`viz.render.diff.diff_html`) shows
in part."""
from __future__ import annotations

from typing import Optional

from ..diff.cost import Cost
from ..diff.result import ALL_RANKS, Delta, DiffResult
from .formatters import fmt_bytes, fmt_count, fmt_flops, fmt_time, runs_text


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


def step_range(result: DiffResult) -> str:
    """The one sentence saying which steps every figure of the diff covers."""
    steps = result.compared_steps
    if not steps:
        return (f"Each run over its own steps (A recorded {runs_text(result.a.steps)}, B "
                f"{runs_text(result.b.steps)}): no step in common.")
    word = "step" if len(steps) == 1 else "steps"
    setup = " (step 0, the setup, left out: docs/metrics.md)" if 0 not in steps and \
        0 in set(result.a.steps) | set(result.b.steps) else ""
    return (f"Compared over {word} {runs_text(steps)} of both runs{setup}: every count, time "
            "and memory figure below.")


def context_lines(result: DiffResult) -> list:
    """What was matched through what: wrappers taken off module paths, files matched by name."""
    lines = []
    if result.a.wrappers or result.b.wrappers:
        lines.append("module paths matched through wrappers: A " +
                     (" + ".join(result.a.wrappers) or "none") + ", B " +
                     (" + ".join(result.b.wrappers) or "none"))
    lines += [f"B's {m.b} is compared as A's {m.a} ({m.shared} functions alike)"
              for m in result.matched_files]
    return lines


def _pair(a: Optional[float], b: Optional[float], fmt, change: bool = True) -> str:
    """``A -> B``, with the relative change where ``change``."""
    if a is None and b is None:
        return "-"
    text = f"{fmt(a) if a is not None else '-'} -> {fmt(b) if b is not None else '-'}"
    if change and a and b is not None:
        text += " (=)" if a == b else f" ({(b - a) / a * 100:+.0f}%)"
    return text


def _seconds(value: float) -> str:
    return fmt_time(value * 1e9)


def cost_rows(result: DiffResult) -> list:
    """(what, A -> B) of the cost per step: step, compute, exposed communication over all and
    per dimension, memory peak and each category's bytes at it."""
    a, b = result.cost
    rows = [("step", _pair(a.step_s, b.step_s, _seconds)),
            ("compute", _pair(a.compute_s, b.compute_s, _seconds)),
            ("exposed comm", _pair(a.exposed_comm_s, b.exposed_comm_s, _seconds))]
    for dim in sorted(set(a.exposed_by_dimension) | set(b.exposed_by_dimension)):
        rows.append((f"exposed comm, {dim}", _pair(a.exposed_by_dimension.get(dim, 0.0),
                                                   b.exposed_by_dimension.get(dim, 0.0),
                                                   _seconds, change=False)))
    return rows + _memory_rows(a, b)


def _memory_rows(a: Cost, b: Cost) -> list:
    if a.memory is None or b.memory is None:
        which = "A" if a.memory is not None else "B" if b.memory is not None else ""
        return [("memory peak", f"recorded in {which} only (the other ran with --no-memory)"
                                if which else "not recorded (both ran with --no-memory)")]
    rows = [("memory peak", _pair(a.memory.peak_bytes, b.memory.peak_bytes, fmt_bytes))]
    for category in reversed(list(a.memory.by_category)):     # parameters first
        va, vb = a.memory.by_category.get(category, 0), b.memory.by_category.get(category, 0)
        if va or vb:
            rows.append((f"memory, {category}", _pair(va, vb, fmt_bytes, change=False)))
    return rows


def cost_lines(result: DiffResult) -> list:
    """The cost per step, A -> B, in two lines: step, compute and exposed communication per
    dimension; the memory peak by category."""
    rows = cost_rows(result)
    time = [f"{what} {pair}" for what, pair in rows if not what.startswith("memory")]
    memory = [f"{what.removeprefix('memory, ')} {pair}" for what, pair in rows
              if what.startswith("memory")]
    return ["Cost per step, A -> B (mean over ranks; memory: the largest rank's peak):",
            "  " + " · ".join(time), "  " + ": ".join([memory[0], ", ".join(memory[1:])]
                                                      if len(memory) > 1 else memory)]


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
    lines += context_lines(result)
    lines += [f"warning: {w}" for w in result.warnings]
    lines += [step_range(result), "", result.verdict(), ""] + cost_lines(result) + [""]
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
    lines += ["", "Time (mean over ranks, summed over the compared steps; measured times differ "
              "on every run, never structure):"]
    lines += _table([(ALL_RANKS, d.name, fmt_value(d.a, d.unit), fmt_value(d.b, d.unit),
                      fmt_rel(d)) for d in result.totals.deltas if d.category == "time"],
                    ("scope", "metric", "A", "B", "change"))
    return "\n".join(lines)
