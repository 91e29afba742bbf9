"""source/<file>.html: a page per source file the call graphs show, each line with the ops and
collectives it issued, the functions defined in it and their zoomed call graphs. The text is
read only as the recording allows (viz.analysis.callgraphs.source_files); with ``--no-source`` none
is."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ...analysis.callgraphs.source_files import SourceText
from ...views import pages
from ...views.callgraph_pages import defined_functions
from ..page_writer import PageWriter

if TYPE_CHECKING:
    from . import ReportInput

PHASE = "writing pages"


def render(report: ReportInput, report_dir: str) -> list:
    """Write every source page into ``report_dir/source``; the paths written."""
    views, recorded = report.views, report.sources
    writer = PageWriter(report_dir)
    defined = defined_functions(views, report.zoom_links)
    report.progress.expect(len(views.source_pages))
    written = []
    for file, rel in views.source_pages.items():
        text = recorded.text(file) if recorded is not None else SourceText(
            None, why_not="source text left out (--no-source)")
        written.append(writer.write(
            rel, "source.html", title=views.paths.get(file, file), recorded_path=file,
            source=text, lines=pages.line_views(text.lines, views.lines.get(file, {})),
            functions=sorted(defined.get(file, []), key=lambda d: d["line"])))
        report.progress.advance()
    return written
