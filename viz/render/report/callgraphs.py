"""callgraphs/: every call-graph page of the report and its picture (``<name>.html`` and
``<name>.svg``): all ranks merged over the training steps, the other steps (setup), one per
distinct rank work, the zoomed functions and modules. Drawn through graphviz
(:mod:`viz.render.callgraph_svg`) in parallel; each page is written as soon as it is drawn, so a
report of many graphs holds few SVGs in memory at once. A picture ``dot`` fails on leaves its
page saying so, and a line naming the page in the report's problems; the rest is drawn."""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from ...views.callgraph_pages import GraphPage, ReportViews
from ...views.formatters import steps_text
from .. import inline_svg
from ..callgraph_svg import DotFailed, render_svg, to_dot
from ..page_writer import PageWriter

if TYPE_CHECKING:
    from . import ReportInput

PHASE = "drawing call graphs"


def render(report: ReportInput, report_dir: str) -> list:
    """Draw and write every call-graph page into ``report_dir/callgraphs``; the paths written."""
    views = report.views
    graphs = views.graphs + ([views.setup] if views.setup else []) + \
        list(views.zooms.values()) + list(views.module_zooms.values())
    writer = PageWriter(report_dir)
    zoom_links = report.zoom_links
    zoomed = views.zoomed
    href = report.source_href("../")

    def draw(page: GraphPage) -> list:
        name = os.path.splitext(os.path.basename(page.rel))[0]
        try:
            svg = render_svg(to_dot(page.graph, title=page.title, paths=views.paths, href=href))
        except DotFailed as exc:
            svg, failed = None, f"its picture was not drawn: {exc}"
            report.problems.append(f"{page.rel}: {failed}")
        written = [writer.write_text(f"callgraphs/{name}.svg", svg)] if svg else []
        zoom_rows = [] if page is views.setup else [
            dict(name=zoomed[fid].name, where=views.paths.get(zoomed[fid].file, ""),
                 href=zoom_links[fid], w=zoomed[fid].total)
            for fid in views.zooms if fid in page.graph.graph
            and views.zooms[fid].rel != page.rel]
        written.append(writer.write(page.rel, "callgraph.html", title=page.title,
                                    note=page.note, svg=inline_svg(svg) if svg else None,
                                    failed=None if svg else failed, svg_file=f"{name}.svg",
                                    zooms=zoom_rows, graph=page.graph,
                                    steps=_steps_note(views, page)))
        report.progress.advance()
        return written

    report.progress.expect(len(graphs))
    with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        return [path for written in pool.map(draw, graphs) for path in written]


def _steps_note(views: ReportViews, page) -> dict:
    """Which steps a graph covers, and where the others are drawn."""
    split = views.split
    if page is views.setup:
        return dict(text=f"{steps_text(split.other)}: the steps the time metrics leave out",
                    other="all.html",
                    other_text=f"the training steps ({steps_text(split.counted)})")
    if views.setup is None:
        return dict(text=f"{steps_text(split.counted)} (every recorded step)", other=None,
                    other_text="")
    return dict(text=f"{steps_text(split.counted)}, the steps the time metrics count",
                other="setup.html", other_text=f"setup and uncounted steps "
                f"({steps_text(split.other)})")
