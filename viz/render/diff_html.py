"""diff.html: the page of a :class:`viz.diff.DiffResult` (jinja2, autoescaped, offline).

Only arranges what viz.diff computed: the verdict, the largest changes, the time metrics of
both runs side by side per rank role, the structural differences, the diff call graphs.
"""
from __future__ import annotations

import os

from ..diff.result import ALL_RANKS
from . import inline_svg
from .diff_text import fmt_rel, fmt_value, largest_changes
from .html import PageWriter

MAX_ROWS = 300      # structural-difference rows per scope on the page (diff.json has all)
TOP_CHANGES = 40


def write_page(result, files: dict, svgs: dict, out_dir: str) -> str:
    """Render diff.html into ``out_dir`` (``files``: scope -> SVG file name, ``svgs``: scope
    -> SVG text); returns its path."""
    scopes = [result.totals] + result.roles
    times = [dict(scope=s, rows=[d for d in s.deltas if d.category == "time"]) for s in scopes]
    keys = sorted(set(result.a.config) | set(result.b.config))
    config = [(k, result.a.config.get(k), result.b.config.get(k)) for k in keys]
    # Each run's own report, when trace-run or trace-report wrote one.
    reports = {side: os.path.relpath(os.path.join(run.dir, "index.html"), out_dir)
               for side, run in (("a", result.a), ("b", result.b))
               if os.path.isfile(os.path.join(run.dir, "index.html"))}
    graphs = [dict(scope=scope, file=files[scope], svg=inline_svg(svg)) for scope, svg in
              svgs.items()]
    return PageWriter(out_dir).write(
        "diff.html", "diff.html", title="trace-diff", result=result, config=config,
        changes=largest_changes(result)[:TOP_CHANGES], times=times, scopes=scopes,
        graphs=graphs, reports=reports, max_rows=MAX_ROWS, all_ranks=ALL_RANKS,
        value=fmt_value, rel=fmt_rel)
