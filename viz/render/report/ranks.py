"""ranks/rank-R.html: one page per rank with a trace: its status, error, metadata, warnings,
ops, collectives, memory at its peak (where recorded), module tree and call graph."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ...views import pages
from ...views.memory_rows import rank_memory
from ..page_writer import PageWriter

if TYPE_CHECKING:
    from . import ReportInput

PHASE = "writing pages"


def render(report: ReportInput, report_dir: str) -> list:
    """Write every rank's page into ``report_dir/ranks``; the paths written."""
    analysis, views = report.analysis, report.views
    writer = PageWriter(report_dir)
    world = tuple(sorted(analysis.ranks))       # the ranks the module tables sum over
    report.progress.expect(len(analysis.ranks))
    written = []
    for row in pages.rank_rows(analysis):
        mine = analysis.ranks.get(row["rank"])
        if mine is not None:
            written.append(writer.write(
                f"ranks/rank-{row['rank']}.html", "rank.html", title=f"Rank {row['rank']}",
                row=row, meta=pages.meta_rows(mine.meta), warnings=mine.warnings,
                ops=pages.op_rows(mine.op_groups), comm=pages.comm_rows(mine.op_groups),
                modules=views.rank_trees[row["rank"]], world=world,
                memory=rank_memory(mine.memory, mine.meta, report.source_href("../"),
                                   views.paths),
                graph=views.rank_graphs[row["rank"]]))
            report.progress.advance()
    return written
