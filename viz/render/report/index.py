"""index.html: the run at a glance: problems first (hung / failed / missing ranks), the
timeline picture, a line per rank (step time and its time per phase, compute, exposed
communication, overlap, bubble), communication by parallel dimension, memory peaks (where
recorded), the top ops and collectives, then the run's facts and links to everything: the
call graphs, the module view, the source pages, the timeline's files, ``summary.json`` and
where the traces are."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

from tracer.files import rundir

from ...views import crossrank_page, pages
from ...views.dimension_rows import dimension_table
from ...views.memory_rows import memory_table
from ...views.problems import problems
from .. import inline_svg
from ..page_writer import PageWriter

if TYPE_CHECKING:
    from . import ReportInput

PHASE = "writing pages"
TOP = 5             # ops and collectives on the front page


def render(report: ReportInput, report_dir: str) -> list:
    """Write ``report_dir/index.html``; its path."""
    analysis, views = report.analysis, report.views
    headline = pages.headline_rows(analysis)
    return [PageWriter(report_dir).write(
        "index.html", "index.html", title="paratrace report",
        problems=problems(analysis), undrawn=report.problems, run=pages.run_facts(analysis),
        lede=pages.lede(analysis), split=views.split,
        headline=headline, bubble=pages.bubble_column(headline), ranks=pages.rank_rows(analysis),
        phases=pages.phase_columns(headline),
        across=crossrank_page.headline(analysis), dimensions=dimension_table(analysis),
        memory=memory_table(analysis),
        top_ops=_top(report, comm=False), top_comm=_top(report, comm=True),
        graphs=views.graphs, rank_graphs=views.rank_graphs, setup=views.setup,
        zooms=list(views.zooms.values()),
        module_zooms=list(views.module_zooms.values()),
        sources=sorted((views.paths.get(f, f), rel) for f, rel in views.source_pages.items()),
        summary_json=rundir.SUMMARY, timeline=inline_svg(report.timeline_svg),
        traces=_traces_path(analysis.run.traces_dir, report_dir),
        timeline_files=report.TIMELINE_FILES)]


def _traces_path(traces_dir: str, report_dir: str) -> str:
    """Where the rank traces are, from the report's directory: ``traces/rank-R.arrow`` for a
    trace-run directory, ``rank-R.arrow`` for a ``tracer.trace`` one (its files at its top),
    a longer relative path for a report written elsewhere (``trace-report --out``)."""
    where = os.path.relpath(os.path.abspath(traces_dir), os.path.abspath(report_dir))
    return os.path.normpath(os.path.join(where, f"rank-R.{rundir.TRACE_EXT}"))


def _top(report: ReportInput, *, comm: bool) -> list:
    views = report.views
    return pages.top_ops(views.training, comm=comm, paths=views.paths,
                         href=report.source_href(), n=TOP)
