"""What the report shows, computed from a :class:`viz.analysis.RunAnalysis`: the call graphs
(all ranks merged, each rank, functions and modules zoomed in), pruned for reading, the module
trees, and what each source line issued. Pure analyses; :mod:`viz.report` draws them.
"""
from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass

from .analysis import RunAnalysis
from .callgraph import (FUNCTION, HIDDEN, CallGraph, build_callgraph, importance, prune,
                        source_lines, total_of, trim_common_prefix)
from .groups import NO_STACK
from .modules import NO_MODULE, module_tree
from .source import display_paths

WHOLE_GRAPH = 0.9   # a function holding this share of every measure is nearly the whole graph


@dataclass(frozen=True)
class ReportOptions:
    """How much the report draws."""

    max_nodes: int = 150         # per SVG, notes of hidden nodes included
    min_share: float = 0.005     # nodes below this share of ops, time and bytes are hidden
    zoom_functions: int = 24     # functions that get their own zoomed call graph
    zoom_modules: int = 16       # modules that get their own call graph
    zoom_min_share: float = 0.02  # ... if they account for at least this share


@dataclass
class GraphPage:
    """One call-graph page to draw."""

    rel: str                  # callgraphs/<name>.html
    title: str
    graph: CallGraph
    note: str = ""


@dataclass
class ReportViews:
    """Everything the report draws besides the timeline."""

    full: CallGraph           # merged call graph of all ranks, unpruned
    graphs: list              # GraphPage: all ranks merged, then one per rank
    zooms: dict               # function node id -> GraphPage
    module_zooms: dict        # module path -> GraphPage
    tree: list                # viz.modules.ModuleRow of all ranks
    rank_trees: dict          # rank -> its ModuleRows
    lines: dict               # file -> line -> viz.callgraph.LineOps
    paths: dict               # recorded file -> short display path
    source_pages: dict        # recorded file -> source/<slug>.html


def report_views(analysis: RunAnalysis, options: ReportOptions = ReportOptions()) -> ReportViews:
    world = tuple(range(analysis.world_size))
    groups = {rank: r.groups for rank, r in analysis.ranks.items()}
    merged = [g for rank in sorted(groups) for g in groups[rank]]
    files = {f.file for g in merged for f in g.path}
    files |= {g.boundary.file for g in merged if g.boundary}
    full = build_callgraph(merged, world=world)
    graphs = [GraphPage("callgraphs/all.html", "Call graph: all ranks merged",
                        _pruned(full, options),
                        "Ops and time are summed over ranks; a purple node is reached by some "
                        "ranks only.")]
    for rank in sorted(groups):
        graphs.append(GraphPage(f"callgraphs/rank-{rank}.html", f"Call graph: rank {rank}",
                                _pruned(build_callgraph(groups[rank], world=world), options)))
    tree = module_tree(merged)
    return ReportViews(
        full=full, graphs=graphs, zooms=_function_zooms(full, graphs[0].graph, merged, world,
                                                        options),
        module_zooms=_module_zooms(tree, merged, world, options), tree=tree,
        rank_trees={rank: module_tree(g) for rank, g in groups.items()},
        lines=source_lines(merged), paths=display_paths(files),
        source_pages=_slugs({f.file for g in merged for f in g.path if f is not NO_STACK}))


def _pruned(graph: CallGraph, options: ReportOptions) -> CallGraph:
    return prune(graph, max_nodes=options.max_nodes, min_share=options.min_share)


def _function_zooms(full: CallGraph, shown: CallGraph, merged: list, world: tuple,
                    options: ReportOptions) -> dict:
    """Function node id -> page of that function zoomed in. Worth it only for functions under
    which the merged graph (``shown``, pruned) hid something, and that are not nearly the whole
    graph already; the biggest first."""
    candidates = [full.node(n) for n in shown.graph
                  if shown.node(n).type == FUNCTION
                  and any(shown.node(c).type == HIDDEN for c in shown.graph.successors(n))
                  and options.zoom_min_share <= importance(full, full.node(n)) < WHOLE_GRAPH]
    candidates.sort(key=lambda d: (-importance(full, d), d.id))
    chosen = candidates[:options.zoom_functions]
    # Each zoom only needs the groups whose path runs through its function.
    keys = {(d.file, d.name) for d in chosen}
    through = defaultdict(list)
    for grp in merged:
        for key in {(f.file, f.qualname) for f in grp.path} & keys:
            through[key].append(grp)
    out = {}
    for i, data in enumerate(chosen):
        key = (data.file, data.name)
        g = build_callgraph(through[key], world=world, root=key)
        out[data.id] = GraphPage(f"callgraphs/fn-{i}.html", f"Zoom: {data.name}",
                                 _pruned(g, options),
                                 "Every path through this function, starting at it; shares "
                                 "are of what it issued.")
    return out


def _module_zooms(tree: list, merged: list, world: tuple, options: ReportOptions) -> dict:
    """Module path -> page of the call graph of that module subtree's ops."""
    total = total_of(r.total for r in tree if r.depth == 0)
    rows = [r for r in tree if r.path != NO_MODULE and r.depth <= 3 and total.ops
            and r.total.ops / total.ops >= options.zoom_min_share]
    rows.sort(key=lambda r: (r.depth, -r.total.ops, r.path))
    out = {}
    for i, row in enumerate(rows[:options.zoom_modules]):
        prefix = row.path + "."
        mine = [g for g in merged if g.module and (g.module == row.path
                                                    or g.module.startswith(prefix))]
        g = build_callgraph(trim_common_prefix(mine), world=world)
        out[row.path] = GraphPage(f"callgraphs/mod-{i}.html", f"Module {row.path}",
                                  _pruned(g, options),
                                  "Ops issued inside this module and its submodules (backward "
                                  "ops by the module that created them).")
    return out


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
    for data in views.full.nodes(FUNCTION):
        out[data.file].append(dict(name=data.name, line=data.line, zoom=zoom_links.get(data.id),
                                   w=data.total))
    return out

