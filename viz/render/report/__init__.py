"""trace-report's renderers: summary.json and the offline HTML report of a run, what users open
after a run. Each is named after what it writes into ``report_dir``::

    summary.json               summary_json: the machine-readable digest
    callgraphs/all.html        callgraphs: call graph of all ranks merged, training steps
                               (+ all.svg); setup.html, the other steps: setup, step 0,
                               unfinished; rank-R.html (+ rank-R.svg), standing for every rank
                               that did the same work (viz.analysis.report_callgraphs.same_work);
                               fn-N.html, a function zoomed in; mod-N.html, one nn.Module subtree
    modules.html               modules_html: the nn.Module tree: ops, FLOPs, time, communication
    source/<file>.html         source: a source file, each line with the ops and collectives it
                               issued
    ranks/rank-R.html          ranks: one rank: status, error, metadata, ops, collectives, modules
    crossrank.html             crossrank: waits, stragglers, bandwidth, mismatches, critical paths
    timeline.svg, timeline.json, timeline.html
                               timeline: the timeline picture, its Chrome trace (Perfetto), the
                               page to pan and zoom it
    index.html                 index: the run at a glance: problems first (hung / failed /
                               missing ranks), the timeline picture, a line per rank, the top ops
                               and collectives, then the run's facts and links to everything
    svgview.js                 pan, zoom and search of the pictures, shared by every page

:data:`RENDERERS` is the registry, in the order trace-report runs it; each takes a
:class:`ReportInput`. The analysis comes in computed (:mod:`viz.analysis`), the views
(:mod:`viz.views`) turn it into graphs to draw, rows and texts; the renderers draw them and
write the files. No page loads anything from the network.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable, ClassVar, Optional

from ...analysis import RunAnalysis
from ...analysis.callgraphs.source_files import RecordedSources
from ...views.callgraph_pages import ReportViews
from ..progress import Progress
from ..timeline_svg import render as draw_timeline
from . import (callgraphs, crossrank, index, modules_html, ranks, source, summary_json,
               timeline)


@dataclass
class ReportInput:
    """What trace-report computed, handed to every renderer of the report."""

    analysis: RunAnalysis
    # what the pages draw (viz.views.callgraph_pages.report_views); None: only the renderers
    # that draw the analysis alone (summary.json, the timeline) can run
    views: Optional[ReportViews] = None
    # the source files the recording allows reading (viz.analysis.callgraphs.source_files); None:
    # none at all (--no-source)
    sources: Optional[RecordedSources] = None
    progress: Progress = field(default_factory=Progress)
    # what could not be written, one line each naming the page (a picture graphviz's dot failed
    # on); the command says them, and the rest of the report is written
    problems: list = field(default_factory=list)

    TIMELINE_FILES: ClassVar[dict] = {"svg": "timeline.svg", "chrome_trace": "timeline.json"}

    @cached_property
    def timeline_svg(self) -> str:
        """The timeline picture, drawn once: timeline.svg, and inline on two pages."""
        a = self.analysis
        return draw_timeline(a.timeline, a.metrics, a.cross, a.paths)

    @property
    def zoom_links(self) -> dict:
        """function node id -> its zoomed call-graph page, relative to callgraphs/."""
        return {fid: os.path.basename(p.rel) for fid, p in self.views.zooms.items()}

    def source_href(self, root: str = "") -> Callable[[str, int], Optional[str]]:
        """(file, line) -> the link to that line's source page from a page ``root`` away from
        the top (None: the file has no page)."""
        pages = self.views.source_pages

        def href(file: str, line: int) -> Optional[str]:
            return f"{root}{pages[file]}#L{line}" if file in pages else None
        return href


RENDERERS = (summary_json, callgraphs, modules_html, source, ranks, crossrank, timeline, index)
PAGE = "index.html"     # the page trace-report prints (the last line on stdout)
