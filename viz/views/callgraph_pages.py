"""The report's call-graph pages in words: each graph the analysis chose
(:mod:`viz.analysis.report_callgraphs`: all ranks merged, one per distinct rank work, the other
steps, functions and modules zoomed in) as a page, with its file, title and note; the source
pages' file names, and the functions each source page lists. :mod:`viz.render.report` draws
them.
"""
from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Optional

from ..analysis.callgraphs.callgraph import CallGraph
from ..analysis.callgraphs.source_files import display_paths
from ..analysis.report_callgraphs import ReportCallGraphs, StepSplit
from .formatters import runs_text, steps_text


@dataclass
class GraphPage:
    """One call-graph page to draw."""

    rel: str                  # callgraphs/<name>.html
    title: str
    graph: CallGraph
    note: str = ""
    ranks: tuple = ()         # a rank's graph: the ranks it stands for (the same work)


@dataclass
class ReportViews:
    """Everything the report draws besides the timeline: the call-graph pages, and what the
    other pages read of the call graphs' analysis."""

    functions: list           # FunctionRow of the merged graph, whole recording
    zoomed: dict              # function node id -> its FunctionRow, training steps (zooms)
    graphs: list              # GraphPage: training steps, all ranks merged, then one per
                              # distinct rank work (viz.analysis.report_callgraphs.same_work)
    setup: Optional[GraphPage]  # the other steps (setup, step 0, unfinished), all ranks merged
    zooms: dict               # function node id -> GraphPage (training steps)
    module_zooms: dict        # module path -> GraphPage (training steps)
    tree: list                # module_tree.ModuleRow of all ranks (training steps)
    rank_trees: dict          # rank -> its ModuleRows (whole recording)
    lines: dict               # file -> line -> callgraph.LineOps (whole recording)
    paths: dict               # recorded file -> short display path
    source_pages: dict        # recorded file -> source/<slug>.html
    split: StepSplit
    training: list            # OpGroups of the training steps, all ranks
    rank_graphs: dict         # rank -> the GraphPage drawn for it (shared by the same work)


def report_views(graphs: ReportCallGraphs) -> ReportViews:
    """The pages of the call graphs the analysis chose for the report."""
    steps = steps_text(graphs.split.counted)
    pages = [GraphPage("callgraphs/all.html", f"Call graph: all ranks merged, {steps}",
                       graphs.merged,
                       "Ops and time are summed over ranks; a purple node is reached by some "
                       "ranks only.")]
    rank_graphs = {}
    for work in graphs.rank_work:
        page = _rank_page(work.ranks, work.graph, steps)
        pages.append(page)
        rank_graphs.update((rank, page) for rank in work.ranks)
    setup = None
    if graphs.setup is not None:
        setup = GraphPage("callgraphs/setup.html", "Call graph: setup and uncounted steps, "
                          f"{steps_text(graphs.split.other)}", graphs.setup,
                          "Step 0 runs from the start of the recording: building the model, "
                          "then the first iteration; a last step cut short by the end of the "
                          "recording is here too. Ops and time are summed over ranks.")
    zooms = {fid: GraphPage(f"callgraphs/fn-{i}.html", f"Zoom: {graphs.zoomed[fid].name}",
                            graph, "Every path through this function, starting at it; shares "
                            "are of what it issued.")
             for i, (fid, graph) in enumerate(graphs.zooms.items())}
    module_zooms = {path: GraphPage(f"callgraphs/mod-{i}.html", f"Module {path}", graph,
                                    "Ops issued inside this module and its submodules "
                                    "(backward ops by the module that created them).")
                    for i, (path, graph) in enumerate(graphs.module_zooms.items())}
    return ReportViews(
        functions=graphs.functions, zoomed=graphs.zoomed, graphs=pages, setup=setup,
        zooms=zooms, module_zooms=module_zooms, tree=graphs.tree, rank_trees=graphs.rank_trees,
        lines=graphs.lines, paths=graphs.paths, source_pages=_slugs(graphs.source_files),
        split=graphs.split, training=graphs.training, rank_graphs=rank_graphs)


def _rank_page(ranks: tuple, graph: CallGraph, steps: str) -> GraphPage:
    """The call-graph page of ``ranks`` (the same work), whose graph is the first one's."""
    first = ranks[0]
    if len(ranks) == 1:
        return GraphPage(f"callgraphs/rank-{first}.html", f"Call graph: rank {first}, {steps}",
                         graph, ranks=(first,))
    names = runs_text(ranks)
    return GraphPage(f"callgraphs/rank-{first}.html",
                     f"Call graph: ranks {names} (the same work), {steps}", graph,
                     f"Ranks {names} did the same work: the same call paths, ops, shapes, counts "
                     f"and bytes. The graph and its times are rank {first}'s; each rank's own "
                     "times are on its rank page.", ranks=tuple(ranks))


def _slugs(files) -> dict:
    """Recorded file -> its source page path, unique and filesystem-safe."""
    out, used = {}, set()
    names = display_paths(files)
    for file in sorted(names):
        base = re.sub(r"[^A-Za-z0-9_.-]", "_", names[file].replace("/", "__")) or "file"
        slug, n = base, 1
        while slug in used:
            n += 1
            slug = f"{base}-{n}"
        used.add(slug)
        out[file] = f"source/{slug}.html"
    return out


def defined_functions(views: ReportViews, zoom_links: dict) -> dict:
    """file -> the functions of the merged graph defined in it (for the source pages)."""
    out = defaultdict(list)
    for row in views.functions:
        out[row.file].append(dict(name=row.name, line=row.line, zoom=zoom_links.get(row.id),
                                  w=row.total))
    return out

