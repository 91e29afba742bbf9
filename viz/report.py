"""The offline HTML report of a run: what users open after a run.

``build_report(analysis, summary, out_dir)`` writes into ``out_dir``::

    index.html                 the run, problems first (hung / failed / missing ranks), a table
                               of ranks, links to everything below
    callgraphs/all.html        call graph of all ranks merged (+ all.svg)
    callgraphs/rank-R.html     call graph of one rank (+ rank-R.svg)
    callgraphs/fn-N.html       a function zoomed in (every path starting there)
    callgraphs/mod-N.html      the ops of one nn.Module subtree
    modules.html               the nn.Module tree: ops, FLOPs, time, communication
    ranks/rank-R.html          one rank: status, error, metadata, ops, collectives, modules
    source/<file>.html         a source file, each line with the ops and collectives it issued
    timeline.svg, timeline.json   the timeline picture and its Chrome trace (Perfetto)

and links ``summary.json`` (:mod:`viz.summary`, written beside it). The analyses come in
computed (:mod:`viz.analysis`, :mod:`viz.views`, :mod:`viz.pages`); this module draws them and
writes the files. No page loads anything from the network.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor

from tracer import rundir

from . import pages
from .analysis import RunAnalysis
from .render import chrome_trace, inline_svg, timeline_svg
from .render.callgraph_svg import render_svg, to_dot
from .render.html import PageWriter
from .source import read_source
from .views import GraphPage, ReportOptions, ReportViews, defined_functions, report_views

TIMELINE_FILES = {"svg": "timeline.svg", "chrome_trace": "timeline.json"}


def build_report(analysis: RunAnalysis, summary: dict, out_dir: str, *,
                 options: ReportOptions = ReportOptions()) -> str:
    """Write index.html and every page it links into ``out_dir``; return index.html's path."""
    os.makedirs(out_dir, exist_ok=True)
    writer = PageWriter(out_dir)
    views = report_views(analysis, options)
    world = tuple(range(analysis.world_size))
    graphs = views.graphs + list(views.zooms.values()) + list(views.module_zooms.values())
    zoom_links = _write_graph_pages(writer, views, graphs)
    writer.write("modules.html", "modules.html", title="Module view", rows=views.tree,
                 links={path: f"callgraphs/{os.path.basename(p.rel)}"
                        for path, p in views.module_zooms.items()}, world=world)
    _write_source_pages(writer, analysis, views, zoom_links)
    rank_rows = pages.rank_rows(analysis, summary)
    for row in rank_rows:
        mine = analysis.ranks.get(row["rank"])
        if mine is not None:
            writer.write(f"ranks/rank-{row['rank']}.html", "rank.html",
                         title=f"Rank {row['rank']}", row=row, meta=pages.meta_rows(mine.meta),
                         warnings=mine.warnings, ops=pages.op_rows(mine.groups),
                         comm=pages.comm_rows(mine.groups),
                         modules=views.rank_trees[row["rank"]], world=world)
    return writer.write("index.html", "index.html", title="paratrace report",
                        problems=pages.problems(analysis), run=pages.run_facts(analysis),
                        ranks=rank_rows, graphs=views.graphs, zooms=list(views.zooms.values()),
                        module_zooms=list(views.module_zooms.values()),
                        sources=sorted((views.paths.get(f, f), rel)
                                       for f, rel in views.source_pages.items()),
                        summary_json=rundir.SUMMARY,
                        timeline=dict(write_timeline(analysis, out_dir)))


def _write_graph_pages(writer: PageWriter, views: ReportViews, graphs: list) -> dict:
    """Draw and write every call-graph page, dot running in parallel; each page is written as
    soon as it is drawn, so a report of many graphs holds few SVGs in memory at once.
    Returns function id -> zoom page."""
    zoom_links = {fid: os.path.basename(p.rel) for fid, p in views.zooms.items()}
    full = views.full

    def href(file, line):
        return f"../{views.source_pages[file]}#L{line}" if file in views.source_pages else None

    def draw(page: GraphPage) -> None:
        svg = render_svg(to_dot(page.graph, title=page.title, paths=views.paths, href=href))
        name = os.path.splitext(os.path.basename(page.rel))[0]
        writer.write_text(f"callgraphs/{name}.svg", svg)
        zoom_rows = [dict(name=full.node(fid).name, where=views.paths.get(full.node(fid).file, ""),
                          href=zoom_links[fid], w=full.node(fid).total)
                     for fid in views.zooms if fid in page.graph.graph
                     and views.zooms[fid].rel != page.rel]
        writer.write(page.rel, "callgraph.html", title=page.title, note=page.note,
                     svg=inline_svg(svg), svg_file=f"{name}.svg", zooms=zoom_rows,
                     graph=page.graph)

    with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        for _ in pool.map(draw, graphs):
            pass
    return zoom_links


def _write_source_pages(writer: PageWriter, analysis: RunAnalysis, views: ReportViews,
                        zoom_links: dict) -> None:
    defined = defined_functions(views, zoom_links)
    started = min((r.meta.get("start_unix") or 0) for r in analysis.ranks.values())
    for file, rel in views.source_pages.items():
        text = read_source(file)
        writer.write(rel, "source.html", title=views.paths.get(file, file), recorded_path=file,
                     available=text is not None, stale=_changed_since(file, started),
                     lines=pages.line_views(text, views.lines.get(file, {})),
                     functions=sorted(defined.get(file, []), key=lambda d: d["line"]))


def _changed_since(file: str, unix_time: float) -> bool:
    """Whether a source file was modified after the run started (its lines may have moved)."""
    try:
        return bool(unix_time) and os.path.getmtime(file) > unix_time
    except OSError:
        return False


def write_timeline(analysis: RunAnalysis, out_dir: str) -> dict:
    """Write ``timeline.svg`` and ``timeline.json`` (Chrome trace) into ``out_dir``; returns
    their paths relative to it."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, TIMELINE_FILES["svg"]), "w") as fh:
        fh.write(timeline_svg.render(analysis.timeline, analysis.metrics))
    with open(os.path.join(out_dir, TIMELINE_FILES["chrome_trace"]), "w") as fh:
        chrome_trace.write(analysis.timeline, fh)
    return TIMELINE_FILES
