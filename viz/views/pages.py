"""What the report's pages show, as rows and texts for the templates: the run's facts, the front
page's headline per rank and its top ops and collectives, a row per rank, each rank's metadata,
op and collective tables, and source lines with what they issued. Built from a
:class:`viz.analysis.RunAnalysis` alone (its metrics, not summary.json); no I/O. The problems
banners: :mod:`.problems`.
"""
from __future__ import annotations

import os
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Optional

from tracer.vocab.labels import PHASES

from ..analysis.callgraphs.op_groups import NO_STACK, Weights, total_of
from ..analysis.run_analysis import RunAnalysis
from .formatters import fmt_bytes, fmt_count, fmt_time, range_text, short_op
from .problems import rank_error


@dataclass
class LineView:
    """A source line with what it issued, as text for the source page."""

    number: int
    text: str
    direct: list = field(default_factory=list)
    comm: list = field(default_factory=list)
    through: list = field(default_factory=list)


def _tie_text(key: object) -> str:
    """A key's text to order ties by: a tuple's as plain strings (a phase is a str Enum, whose
    repr inside a tuple's text would name its class and change the order)."""
    return str(tuple(str(k) for k in key)) if isinstance(key, tuple) else str(key)


def _summarise(entries: dict, key_text) -> list:
    """Line annotations: one text per (what, direction), biggest first."""
    items = sorted(entries.items(), key=lambda kv: (-kv[1].ops, _tie_text(kv[0])))
    return [key_text(key, w) for key, w in items]


def line_views(text: Optional[list], per_line: dict) -> list:
    """Every line of a readable file, or only the lines that issued ops when it is not."""
    numbers = range(1, len(text) + 1) if text is not None else sorted(per_line)
    out = []
    for n in numbers:
        ops = per_line.get(n)
        view = LineView(n, text[n - 1] if text is not None and n <= len(text) else "")
        if ops is not None:
            view.direct = _summarise(ops.direct, lambda k, w: (
                f"{k[1]}: {short_op(k[0])} x{fmt_count(w.ops)} · {fmt_time(w.time_ns)}"))
            view.comm = _summarise(ops.comm, lambda k, w: (
                f"{k[1]}: {k[0]} x{fmt_count(w.comms)} · {fmt_bytes(w.bytes)} · "
                f"{fmt_time(w.time_ns)}"))
            view.through = _summarise(ops.through, lambda k, w: (
                f"{k}: {fmt_count(w.ops)} ops in the functions it calls · "
                f"{fmt_time(w.time_ns)}"))
        out.append(view)
    return out


def row_ranks(analysis: RunAnalysis) -> list:
    """The rank tables' rows in rank order: each rank with a row of its own (a trace file, or
    an entry in run.json), and one ``ranks 2-999`` text per run of the others (no trace file,
    nothing known), so a world of a million beside 2 traces is 3 rows."""
    rows = [(rank, rank) for rank in analysis.listed()]
    rows += [(first, range_text(first, last) if last > first else first)
             for first, last in analysis.unlisted()]
    return [rank for _, rank in sorted(rows, key=lambda row: row[0])]


def rank_rows(analysis: RunAnalysis) -> list:
    """One row per rank of the index's rank table (:func:`row_ranks`)."""
    rows = []
    for rank in row_ranks(analysis):
        row = dict(rank=rank, status=analysis.status(rank), error=rank_error(analysis, rank),
                   host="", events=0, w=Weights(), compute=Weights(), comm=Weights(), time={})
        mine = analysis.ranks.get(rank)
        if mine is not None:
            row["host"] = mine.meta.get("host", "")
            row["events"] = mine.events
            row["w"] = total_of(g.weights() for g in mine.op_groups)
            row["compute"] = total_of(g.weights() for g in mine.op_groups if not g.kind)
            row["comm"] = total_of(g.weights() for g in mine.op_groups if g.kind)
        row["time"] = _time_texts(_metrics(analysis, rank))
        rows.append(row)
    return rows


def bubble_column(headline: list) -> dict:
    """The heading and footnote of the headline's last share (:func:`headline_rows`): the
    pipeline bubble beside the schedule's theory where a rank has a pipeline; else no bubble
    and no theory, but what the share is: the step without compute (exposed communication,
    memory activity, idle time). ``short``: the same column's name in the ranks table."""
    if any(row["bubble_kind"] == "pipeline" for row in headline):
        return dict(heading="bubble (theory)", short="bubble",
                    title="pipeline bubble (the schedule's theoretical bubble)",
                    note="bubble: the pipeline bubble beside the schedule's theoretical one "
                         "(a rank without a pipeline: the share of its step not computing)")
    return dict(heading="no compute", short="no compute",
                title="share of the step without compute: exposed communication, memory "
                      "and idle",
                note="no compute: the share of the step without compute, that is exposed "
                     "communication, memory activity and idle time (no pipeline in this run: "
                     "no bubble to set beside a schedule's theory)")


def _metrics(analysis: RunAnalysis, rank: int):
    """A rank's time metrics (viz.analysis.timeline.metrics.RankMetrics), or None: a rank without a
    readable trace has none."""
    return analysis.metrics.get(rank) if rank in analysis.ranks else None


def _time_texts(metrics) -> dict:
    """A rank's time metrics, formatted (seconds and fractions; '' where there is none)."""
    def seconds(value):
        return fmt_time(value * 1e9) if isinstance(value, (int, float)) else ""

    def percent(value):
        return f"{100 * value:.1f} %" if isinstance(value, (int, float)) else ""
    if metrics is None:
        return dict(wall="", exposed_comm="", bubble="")
    return dict(wall=seconds(metrics.wall_s), exposed_comm=seconds(metrics.exposed_comm_s),
                bubble=percent(metrics.bubble_fraction))


def headline_rows(analysis: RunAnalysis) -> list:
    """The front page's line per rank, from its time metrics: the mean counted step's time,
    compute and exposed communication, the overlap, the bubble beside the theory for the
    schedule, and the clock the metrics were measured on (the rank's lanes' clock; ``host``
    for a rank without a trace). ``bar``: compute, exposed communication and the rest as shares
    of the step, for the stacked bar; on the device clock, memory activity (memcpys, memsets)
    under neither is a share of its own, not idle. A rank without metrics gets empty texts."""
    rows = []
    for rank in row_ranks(analysis):
        mine = analysis.ranks.get(rank)
        row = dict(rank=rank, status=analysis.status(rank),
                   clock=mine.lanes.clock if mine is not None else "host", step="",
                   compute="", exposed="", memory="", overlap="", bubble="",
                   bubble_kind="no compute", theory="", bar=[], phases={})
        metrics = _metrics(analysis, rank)
        if metrics is not None:
            row.update(_headline(metrics))
        rows.append(row)
    return rows


def _headline(m) -> dict:
    """The headline's texts of one rank's metrics (viz.analysis.timeline.metrics.RankMetrics)."""
    steps = len(m.counted_steps) or 1
    wall, compute, exposed = m.wall_s, m.compute_s, m.exposed_comm_s
    pipeline = m.pipeline.bubble_fraction if m.pipeline is not None else None
    out = dict(step=_seconds(wall, steps), compute=_seconds(compute, steps),
               exposed=_seconds(exposed, steps), overlap=_percent(m.overlap_fraction),
               bubble=_percent(pipeline if pipeline is not None else m.bubble_fraction),
               bubble_kind="pipeline" if pipeline is not None else "no compute",
               # the schedule's theory is about a pipeline bubble: none without one
               theory=_percent(m.theoretical_bubble_fraction) if pipeline is not None else "",
               bar=[], phases={phase: _seconds(s, steps) for phase, s in m.phase_s.items()
                               if s > 0})
    if wall:
        c = min(compute, wall) / wall
        e = min(exposed / wall, 1 - c)
        out["bar"] = [("compute", 100 * c), ("comm", 100 * e)]
        rest = max(0.0, 1 - c - e)
        if m.memory_s > 0:
            # idle is what none of compute, communication and memory covers (docs/metrics.md),
            # so memory under neither of the first two is the rest of the step
            idle = min(max(m.idle_s, 0.0) / wall, rest)
            out["memory"] = _seconds((rest - idle) * wall, steps)
            out["bar"].append(("memory", 100 * (rest - idle)))
            rest = idle
        out["bar"].append(("idle", 100 * rest))
    return out


def phase_columns(headline: list) -> list:
    """The phases the headline shows a column of, beside the step: those with time on some
    rank, in a step's order (forward, backward, recompute, grad_sync, optimizer, other)."""
    seen = {phase for row in headline for phase in row["phases"]}
    return [phase for phase in PHASES[1:] + PHASES[:1] if phase in seen]


def _seconds(value: Optional[float], steps: int) -> str:
    return "" if value is None else fmt_time(value / steps * 1e9)


def _percent(value) -> str:
    return f"{100 * value:.0f} %" if isinstance(value, (int, float)) else ""


def top_ops(groups: list, *, comm: bool, paths: dict, href, n: int = 5) -> list:
    """The ``n`` compute ops (``comm=False``, by op) or collectives (``comm=True``, by kind and
    phase) that took the most time in ``groups``, each with the source line that issued most of
    that time (the innermost user frame; for a backward op, the forward line that created it),
    its display path (``paths``) and source-page link (``href(file, line)``, or None), and how
    many lines issued it."""
    totals, lines = defaultdict(Weights), defaultdict(lambda: defaultdict(float))
    for g in groups:
        if bool(g.kind) != comm:
            continue
        key = (g.kind, g.phase) if comm else g.op
        totals[key].add(g.weights())
        site = g.path[-1]
        lines[key][(site.file, site.line, site.qualname)] += g.time_ns
    whole = sum(w.time_ns for w in totals.values()) or 1.0
    top = sorted(totals.items(), key=lambda kv: (-kv[1].time_ns, _tie_text(kv[0])))[:n]
    rows = []
    for key, w in top:
        (file, line, qualname), _ = max(lines[key].items(), key=lambda kv: (kv[1], kv[0]))
        row = dict(name=f"{key[0]} ({key[1]})" if comm else short_op(key),
                   full=" in ".join(key) if comm else key, w=w, share=100 * w.time_ns / whole,
                   path=f"{paths.get(file, file)}:{line}", where=f"{os.path.basename(file)}:{line}",
                   href=href(file, line), qualname=qualname, lines=len(lines[key]))
        if file == NO_STACK.file:
            row.update(path="", where=NO_STACK.qualname, href=None, qualname="")
        more = row["lines"] - 1
        row["detail"] = ", ".join(filter(None, [row["qualname"], more and (
            f"+{more} more line{'s' if more > 1 else ''}")]))
        rows.append(row)
    return rows


def op_rows(groups: list) -> list:
    """(op, phase) -> what they account for, most time first (then most calls)."""
    counts = defaultdict(Weights)
    for g in groups:
        counts[(g.op, g.phase)].add(g.weights())
    return sorted(counts.items(), key=lambda kv: (-kv[1].time_ns, -kv[1].ops, kv[0]))


def comm_rows(groups: list) -> list:
    """(kind, phase) -> what the collectives of that kind account for, most time first."""
    rows = defaultdict(Weights)
    for g in groups:
        if g.kind:
            rows[(g.kind, g.phase)].add(g.weights())
    return sorted(rows.items(), key=lambda kv: (-kv[1].time_ns, kv[0]))


_META_KEYS = ("host", "pid", "local_rank", "node_rank", "backend", "torch", "python", "status",
              "error", "last_step", "last_collective", "inflight")


def meta_rows(meta: dict) -> list:
    """A trace's metadata as (key, text) rows."""
    rows = [(k, meta.get(k)) for k in _META_KEYS if meta.get(k) not in (None, "", [], {})]
    for key in ("clock_start", "clock_end"):
        clock = meta.get(key)
        if clock:
            rows.append((key, f"offset {fmt_time(abs(clock.get('offset_ns', 0)))} "
                              f"{'ahead' if clock.get('offset_ns', 0) < 0 else 'behind'}, error "
                              f"<= {fmt_time(clock.get('error_ns', 0))} ({clock.get('method')})"))
    if meta.get("start_unix"):
        rows.append(("started", utc(meta["start_unix"])))
    return rows


def utc(ts: float) -> str:
    return datetime.fromtimestamp(float(ts), timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


_LEDE_KEYS = (("tp", "tp {}"), ("sp", "sp"), ("pp", "pp {}"), ("dp", "dp {}"),
              ("schedule", "{}"), ("microbatches", "{} micro-batches"),
              ("virtual_stages", "{} virtual stages"))


# keys that mean something only when another size is above 1
_LEDE_NEEDS = {"sp": "tp", "schedule": "pp", "microbatches": "pp", "virtual_stages": "pp"}


def _above_one(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 1


def lede(analysis: RunAnalysis) -> list:
    """The run in a few words for the front page: ranks, then the parallel configuration
    (``tracer.record_config``'s usual keys, those present; sizes of 1 and false flags left
    out)."""
    parts = [f"{analysis.world_size} rank{'s' if analysis.world_size != 1 else ''}"]
    config = analysis.config
    for key, text in _LEDE_KEYS:
        needs = _LEDE_NEEDS.get(key)
        if needs in config and not _above_one(config[needs]):
            continue            # sequence parallelism without TP, a schedule without a pipeline
        value = config.get(key)
        if isinstance(value, bool):
            if value:
                parts.append(text.format(value))
            continue
        if value in (None, "") or (isinstance(value, int) and value <= 1
                                   and key != "microbatches"):
            continue
        parts.append(text.format(value))
    return parts


def run_facts(analysis: RunAnalysis) -> dict:
    """The run's command, exit code, sizes, steps and versions."""
    first = analysis.ranks[min(analysis.ranks)].meta
    run = analysis.run
    command = run.info.get("command")
    if isinstance(command, list):
        command = " ".join(str(c) for c in command)
    steps = set(analysis.recorded_steps)
    return dict(command=command or " ".join(first.get("argv") or []),
                exit_code=run.info.get("exit_code"), world_size=analysis.world_size,
                config=analysis.config, steps=steps, backend=first.get("backend"),
                torch=first.get("torch"), dir=run.dir,
                started=utc(first["start_unix"]) if first.get("start_unix") else "")
