"""crossrank.html: what happened across ranks: waits, stragglers, bandwidth, mismatches and
each step's critical path (docs/crossrank.md), from :mod:`viz.views.crossrank_page`."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ...views import crossrank_page
from ..page_writer import PageWriter

if TYPE_CHECKING:
    from . import ReportInput

PHASE = "writing pages"


def render(report: ReportInput, report_dir: str) -> list:
    """Write ``report_dir/crossrank.html``; its path."""
    analysis, views = report.analysis, report.views
    report.progress.expect(1)
    clocks = {lane.clock for lane in analysis.timeline.ranks.values()}
    path = PageWriter(report_dir).write(
        "crossrank.html", "crossrank.html", title="Across ranks", cross=analysis.cross,
        clock=" and ".join(sorted(clocks)), mismatches=crossrank_page.mismatches(analysis),
        stragglers=crossrank_page.stragglers(analysis),
        heat=crossrank_page.heat_map(analysis),
        bandwidth=crossrank_page.bandwidth(analysis, views.paths, report.source_href()),
        paths=crossrank_page.paths_rows(analysis))
    report.progress.advance()
    return [path]
