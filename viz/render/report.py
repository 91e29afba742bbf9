"""The offline HTML report of a run: what users open after a run.

``build_report(analysis, out_dir)`` writes into ``out_dir``::

    index.html                 the run at a glance: problems first (hung / failed / missing
                               ranks), the timeline picture, a line per rank (step time,
                               compute, exposed communication, overlap, bubble), the top ops
                               and collectives, then the run's facts and links to everything
    timeline.html              the timeline picture to pan and zoom
    callgraphs/all.html        call graph of all ranks merged, training steps (+ all.svg)
    callgraphs/setup.html      call graph of the other steps: setup, step 0, unfinished
    callgraphs/rank-R.html     call graph of rank R (+ rank-R.svg), standing for every rank
                               that did the same work (viz.views.callgraph_pages.same_work)
    callgraphs/fn-N.html       a function zoomed in (every path starting there)
    callgraphs/mod-N.html      the ops of one nn.Module subtree
    modules.html               the nn.Module tree: ops, FLOPs, time, communication
    ranks/rank-R.html          one rank: status, error, metadata, ops, collectives, modules
    source/<file>.html         a source file, each line with the ops and collectives it issued
    timeline.svg, timeline.json   the timeline picture and its Chrome trace (Perfetto)
    svgview.js                 pan, zoom and search of the pictures, shared by every page

and links ``summary.json`` (:mod:`.summary_json`, written beside it). The analysis comes in
computed (:mod:`viz.analysis`), the training steps recounted where needed (viz.cli); the views
(:mod:`viz.views`) turn it into graphs to draw, rows and texts; this module draws them and
writes the files. No page loads anything from the network.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

from tracer.files import rundir

from . import chrome_trace, inline_svg, timeline_svg
from ..analysis import RunAnalysis
from ..analysis.source import RecordedSources, SourceText, reading
from ..views import crossrank_page, pages
from ..views.callgraph_pages import (GraphPage, ReportOptions, ReportViews, defined_functions,
                                     report_views)
from ..views.problems import problems
from .callgraph_svg import render_svg, to_dot
from .html import PageWriter
from .progress import Progress

TIMELINE_FILES = {"svg": "timeline.svg", "chrome_trace": "timeline.json"}
TOP = 5             # ops and collectives on the front page


def build_report(analysis: RunAnalysis, out_dir: str, *,
                 training: Optional[RunAnalysis] = None,
                 options: ReportOptions = ReportOptions(),
                 progress: Optional[Progress] = None, sources: bool = True) -> str:
    """Write index.html and every page it links into ``out_dir``; return index.html's path.
    The call graphs show the training steps: ``training`` is the analysis recounted over them
    (viz.analysis.map_reduce.training; None: every recorded step counts); ``progress`` shows
    how far it got. Source files are read only as the recording allows
    (viz.analysis.source); ``sources=False`` reads none (``--no-source``: a report to
    share)."""
    recorded = RecordedSources(mine.meta for mine in analysis.ranks.values()) if sources \
        else None
    progress = progress or Progress()
    with reading(recorded):
        with progress.phase("building the call graphs"):
            views = report_views(analysis, options, training=training)
        return _write_report(analysis, views, out_dir, progress, recorded)


def _write_report(analysis: RunAnalysis, views: ReportViews, out_dir: str, progress: Progress,
                  recorded: Optional[RecordedSources]) -> str:
    os.makedirs(out_dir, exist_ok=True)
    writer = PageWriter(out_dir)
    world = tuple(sorted(analysis.ranks))       # the ranks the module tables sum over
    graphs = views.graphs + ([views.setup] if views.setup else []) + \
        list(views.zooms.values()) + list(views.module_zooms.values())
    zoom_links = _write_graph_pages(writer, views, graphs, progress)
    with progress.phase("writing pages", len(views.source_pages) + len(analysis.ranks) + 3):
        writer.write("modules.html", "modules.html", title="Module view", rows=views.tree,
                     links={path: f"callgraphs/{os.path.basename(p.rel)}"
                            for path, p in views.module_zooms.items()}, world=world,
                     steps=views.split.text(views.split.counted))
        progress.advance()
        _write_source_pages(writer, views, zoom_links, progress, recorded)
        rank_rows = pages.rank_rows(analysis)
        for row in rank_rows:
            mine = analysis.ranks.get(row["rank"])
            if mine is not None:
                writer.write(f"ranks/rank-{row['rank']}.html", "rank.html",
                             title=f"Rank {row['rank']}", row=row,
                             meta=pages.meta_rows(mine.meta), warnings=mine.warnings,
                             ops=pages.op_rows(mine.op_groups),
                             comm=pages.comm_rows(mine.op_groups),
                             modules=views.rank_trees[row["rank"]], world=world,
                             graph=views.rank_graphs[row["rank"]])
                progress.advance()
        _write_crossrank_page(writer, analysis, views)
        progress.advance()
        timeline = inline_svg(_write_timeline_files(analysis, out_dir))
        writer.write("timeline.html", "timeline.html", title="Timeline", svg=timeline,
                     files=TIMELINE_FILES)
        progress.advance()
        headline = pages.headline_rows(analysis)
        return writer.write(
            "index.html", "index.html", title="paratrace report",
            problems=problems(analysis), run=pages.run_facts(analysis),
            lede=pages.lede(analysis), split=views.split,
            headline=headline, bubble=pages.bubble_column(headline), ranks=rank_rows,
            across=crossrank_page.headline(analysis),
            top_ops=_top(views, comm=False), top_comm=_top(views, comm=True),
            graphs=views.graphs, rank_graphs=views.rank_graphs, setup=views.setup,
            zooms=list(views.zooms.values()),
            module_zooms=list(views.module_zooms.values()),
            sources=sorted((views.paths.get(f, f), rel) for f, rel in views.source_pages.items()),
            summary_json=rundir.SUMMARY, timeline=timeline, timeline_files=TIMELINE_FILES)


def _write_crossrank_page(writer: PageWriter, analysis: RunAnalysis, views: ReportViews) -> None:
    def href(file, line):
        return f"{views.source_pages[file]}#L{line}" if file in views.source_pages else None
    clocks = {lane.clock for lane in analysis.timeline.ranks.values()}
    writer.write("crossrank.html", "crossrank.html", title="Across ranks", cross=analysis.cross,
                 clock=" and ".join(sorted(clocks)),
                 mismatches=crossrank_page.mismatches(analysis),
                 stragglers=crossrank_page.stragglers(analysis),
                 heat=crossrank_page.heat_map(analysis),
                 bandwidth=crossrank_page.bandwidth(analysis, views.paths, href),
                 paths=crossrank_page.paths_rows(analysis))


def _top(views: ReportViews, *, comm: bool) -> list:
    def href(file, line):
        return f"{views.source_pages[file]}#L{line}" if file in views.source_pages else None
    return pages.top_ops(views.training, comm=comm, paths=views.paths, href=href, n=TOP)


def _write_graph_pages(writer: PageWriter, views: ReportViews, graphs: list,
                       progress: Progress) -> dict:
    """Draw and write every call-graph page, dot running in parallel; each page is written as
    soon as it is drawn, so a report of many graphs holds few SVGs in memory at once.
    Returns function id -> zoom page."""
    zoom_links = {fid: os.path.basename(p.rel) for fid, p in views.zooms.items()}
    zoomed = views.zoomed

    def href(file, line):
        return f"../{views.source_pages[file]}#L{line}" if file in views.source_pages else None

    def draw(page: GraphPage) -> None:
        svg = render_svg(to_dot(page.graph, title=page.title, paths=views.paths, href=href))
        name = os.path.splitext(os.path.basename(page.rel))[0]
        writer.write_text(f"callgraphs/{name}.svg", svg)
        zoom_rows = [] if page is views.setup else [
            dict(name=zoomed[fid].name, where=views.paths.get(zoomed[fid].file, ""),
                 href=zoom_links[fid], w=zoomed[fid].total)
            for fid in views.zooms if fid in page.graph.graph
            and views.zooms[fid].rel != page.rel]
        writer.write(page.rel, "callgraph.html", title=page.title, note=page.note,
                     svg=inline_svg(svg), svg_file=f"{name}.svg", zooms=zoom_rows,
                     graph=page.graph, steps=_steps_note(views, page))
        progress.advance()

    with progress.phase("drawing call graphs", len(graphs)), \
            ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        for _ in pool.map(draw, graphs):
            pass
    return zoom_links


def _steps_note(views: ReportViews, page) -> dict:
    """Which steps a graph covers, and where the others are drawn."""
    split = views.split
    if page is views.setup:
        return dict(text=f"{split.text(split.other)}: the steps the time metrics leave out",
                    other="all.html",
                    other_text=f"the training steps ({split.text(split.counted)})")
    if views.setup is None:
        return dict(text=f"{split.text(split.counted)} (every recorded step)", other=None,
                    other_text="")
    return dict(text=f"{split.text(split.counted)}, the steps the time metrics count",
                other="setup.html", other_text=f"setup and uncounted steps "
                f"({split.text(split.other)})")


def _write_source_pages(writer: PageWriter, views: ReportViews, zoom_links: dict,
                        progress: Progress, recorded: Optional[RecordedSources]) -> None:
    defined = defined_functions(views, zoom_links)
    for file, rel in views.source_pages.items():
        text = recorded.text(file) if recorded is not None else SourceText(
            None, why_not="source text left out (--no-source)")
        writer.write(rel, "source.html", title=views.paths.get(file, file), recorded_path=file,
                     source=text, lines=pages.line_views(text.lines, views.lines.get(file, {})),
                     functions=sorted(defined.get(file, []), key=lambda d: d["line"]))
        progress.advance()


def write_timeline(analysis: RunAnalysis, out_dir: str) -> dict:
    """Write ``timeline.svg`` and ``timeline.json`` (Chrome trace) into ``out_dir``; returns
    their paths relative to it."""
    _write_timeline_files(analysis, out_dir)
    return TIMELINE_FILES


def _write_timeline_files(analysis: RunAnalysis, out_dir: str) -> str:
    """Write the timeline's files; returns the SVG text (the front page shows it too)."""
    os.makedirs(out_dir, exist_ok=True)
    svg = timeline_svg.render(analysis.timeline, analysis.metrics, analysis.cross,
                              analysis.paths)
    with open(os.path.join(out_dir, TIMELINE_FILES["svg"]), "w") as fh:
        fh.write(svg)
    with open(os.path.join(out_dir, TIMELINE_FILES["chrome_trace"]), "w") as fh:
        chrome_trace.write(analysis.timeline, fh)
    return svg
