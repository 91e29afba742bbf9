"""The timeline's files: ``timeline.svg`` (the picture, :mod:`viz.render.timeline_svg`, drawn
once and shown inline on the front page too), ``timeline.json`` (its Chrome trace for
Perfetto, :mod:`viz.render.timeline_json`, written rank by rank) and ``timeline.html`` (the page
to pan and zoom it). Draws the analysis alone: no views needed."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

from .. import inline_svg, timeline_json
from ..page_writer import PageWriter

if TYPE_CHECKING:
    from . import ReportInput

PHASE = "writing pages"


def render(report: ReportInput, report_dir: str) -> list:
    """Write the timeline's picture, Chrome trace and page into ``report_dir``; their paths."""
    os.makedirs(report_dir, exist_ok=True)
    files = report.TIMELINE_FILES
    report.progress.expect(1)
    written = [os.path.join(report_dir, files["svg"]),
               os.path.join(report_dir, files["chrome_trace"])]
    with open(written[0], "w") as fh:
        fh.write(report.timeline_svg)
    with open(written[1], "w") as fh:
        timeline_json.write(report.analysis.timeline, fh, report.analysis.cross.matched)
    written.append(PageWriter(report_dir).write("timeline.html", "timeline.html", title="Timeline",
                                             svg=inline_svg(report.timeline_svg), files=files))
    report.progress.advance()
    return written
