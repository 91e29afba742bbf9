"""diff.html: the page of a :class:`viz.diff.DiffResult` (jinja2, autoescaped, offline).

Only arranges what viz.diff computed: the step range, what was matched through wrappers and
renamed files, the verdict, the cost per step, the largest changes, the time metrics of
both runs side by side per rank role, the structural differences, the diff call graphs (inline,
as :mod:`.diff_callgraphs` writes them), links to each run's own report.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ...diff.result import ALL_RANKS
from ...views.diff_table import (context_lines, cost_rows, fmt_rel, fmt_value,
                                  largest_changes, step_range)
from .. import inline_svg
from ..page_writer import PageWriter

if TYPE_CHECKING:
    from . import DiffInput

PHASE = "drawing the diff call graphs"
MAX_ROWS = 300      # structural-difference rows per scope on the page (diff.json has all)
TOP_CHANGES = 40


def render(diff: DiffInput, report_dir: str) -> list:
    """Write ``report_dir/diff.html``; its path."""
    result, files = diff.result, diff.svg_files
    scopes = [result.totals] + result.roles
    times = [dict(scope=s, rows=[d for d in s.deltas if d.category == "time"]) for s in scopes]
    keys = sorted(set(result.a.config) | set(result.b.config))
    config = [(k, result.a.config.get(k), result.b.config.get(k)) for k in keys]
    # Each run's own report, when trace-run or trace-report wrote one.
    reports = {side: os.path.relpath(os.path.join(run.dir, "index.html"), report_dir)
               for side, run in (("a", result.a), ("b", result.b))
               if os.path.isfile(os.path.join(run.dir, "index.html"))}
    graphs = [dict(scope=scope, file=files[scope], svg=inline_svg(svg)) for scope, svg in
              diff.svgs.items()]
    return [PageWriter(report_dir).write(
        "diff.html", "diff.html", title="trace-diff", result=result, config=config,
        changes=largest_changes(result)[:TOP_CHANGES], times=times, scopes=scopes,
        graphs=graphs, reports=reports, max_rows=MAX_ROWS, all_ranks=ALL_RANKS,
        value=fmt_value, rel=fmt_rel, step_range=step_range(result),
        context=context_lines(result), cost=cost_rows(result))]
