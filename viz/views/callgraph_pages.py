"""What the report shows, computed from a :class:`viz.analysis.RunAnalysis`: the call graphs
(all ranks merged, each rank, functions and modules zoomed in), pruned for reading, the module
trees, and what each source line issued. Pure analyses; :mod:`viz.render.report` draws them.

Call graphs and the module view show the *training steps*: the steps the time metrics count
(:func:`viz.analysis.timeline.lanes.counted_steps`: step 0, which carries the model's construction
and other setup, and an unfinished last step are left out). What the other steps did gets one merged
graph of its own (:func:`step_split`, :func:`groups_outside`). Source pages and the ranks' own pages
cover the whole recording.
"""
from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass, replace
from typing import Optional

from ..analysis.callgraphs.callgraph import (FUNCTION, HIDDEN, CallGraph, build_callgraph,
                                             importance, prune, source_lines, total_of,
                                             trim_common_prefix)
from ..analysis.callgraphs.module_tree import NO_MODULE, module_tree
from ..analysis.callgraphs.op_groups import NO_STACK, Weights
from ..analysis.callgraphs.source_files import display_paths
from ..analysis.run_analysis import RunAnalysis
from .formatters import runs_text, steps_text

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
    ranks: tuple = ()         # a rank's graph: the ranks it stands for (the same work)


@dataclass(frozen=True)
class StepSplit:
    """Which recorded steps the call graphs show (``counted``) and which go to the setup graph
    (``other``: empty when every step counts)."""

    counted: tuple
    other: tuple

    def text(self, steps: tuple) -> str:
        """``step 1``, ``steps 1-9``, ``steps 0, 10`` (:func:`.formatters.steps_text`)."""
        return steps_text(steps)


def step_split(analysis: RunAnalysis) -> StepSplit:
    """The training steps (counted by any rank's time metrics) and the other recorded steps."""
    recorded = analysis.recorded_steps
    counted = {s for m in analysis.metrics.values() for s in m.counted_steps} & recorded
    counted = counted or recorded
    return StepSplit(tuple(sorted(counted)), tuple(sorted(recorded - counted)))


_GROUP_KEY = ("rank", "path", "boundary", "via", "op", "phase", "kind", "shapes", "module")


def groups_outside(whole: list, part: list) -> list:
    """The op groups of ``whole`` (a rank's whole recording) less ``part`` (the same rank
    recounted over some of its steps, :func:`viz.analysis.recount`): what the other steps did.
    Several groups can share an attribution (stacks that differ in library frames only), so
    both sides are summed by attribution first."""
    def summed(groups):
        out = {}
        for g in groups:
            key = tuple(getattr(g, k) for k in _GROUP_KEY)
            have = out.get(key)
            out[key] = g if have is None else replace(
                have, count=have.count + g.count, time_ns=have.time_ns + g.time_ns,
                bytes=have.bytes + g.bytes, flops=have.flops + g.flops)
        return out

    taken = summed(part)
    out = []
    for key, g in summed(whole).items():
        p = taken.get(key)
        if p is not None:
            if g.count <= p.count:
                continue
            g = replace(g, count=g.count - p.count, time_ns=max(g.time_ns - p.time_ns, 0.0),
                        bytes=max(g.bytes - p.bytes, 0), flops=max(g.flops - p.flops, 0))
        out.append(g)
    return out


@dataclass(frozen=True)
class FunctionRow:
    """A function of a merged call graph, with everything it issued (all ranks)."""

    id: str
    file: str
    name: str
    line: int
    total: Weights


def function_rows(graph: CallGraph) -> list:
    """The function nodes of ``graph``, in its order."""
    return [FunctionRow(d.id, d.file, d.name, d.line, d.total) for d in graph.nodes(FUNCTION)]


@dataclass
class ReportViews:
    """Everything the report draws besides the timeline. The merged graphs are kept pruned
    only: of the unpruned ones (tens of MiB for many ranks), just their functions."""

    functions: list           # FunctionRow of the merged graph, whole recording
    zoomed: dict              # function node id -> its FunctionRow, training steps (zooms)
    graphs: list              # GraphPage: training steps, all ranks merged, then one per
                              # distinct rank structure (:func:`same_work`)
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


def report_views(analysis: RunAnalysis, options: ReportOptions = ReportOptions(), *,
                 training: Optional[RunAnalysis] = None) -> ReportViews:
    """``training``: ``analysis`` recounted over :func:`step_split`'s counted steps (None:
    every recorded step counts, the analysis is the training steps)."""
    # the ranks that recorded something: a node reached by all of them is reached by all
    # (absent ranks of a large world would cost memory per rank and tell nothing)
    world = tuple(sorted(analysis.ranks))
    split = step_split(analysis)
    whole = {rank: r.op_groups for rank, r in analysis.ranks.items()}
    groups = {rank: r.op_groups for rank, r in (training or analysis).ranks.items()}
    everything = [g for rank in sorted(whole) for g in whole[rank]]
    merged = [g for rank in sorted(groups) for g in groups[rank]]
    files = {f.file for g in everything for f in g.path}
    files |= {g.boundary.file for g in everything if g.boundary}
    full = build_callgraph(everything, world=world)
    functions = function_rows(full)
    steps = split.text(split.counted)
    trained = full if training is None else build_callgraph(merged, world=world)
    del full
    graphs = [GraphPage("callgraphs/all.html", f"Call graph: all ranks merged, {steps}",
                        _pruned(trained, options),
                        "Ops and time are summed over ranks; a purple node is reached by some "
                        "ranks only.")]
    zooms = _function_zooms(trained, graphs[0].graph, merged, world, options)
    zoomed = {row.id: row for row in function_rows(trained) if row.id in zooms}
    del trained             # the rank graphs, setup graph and module zooms are built without it
    rank_graphs = {}
    # every readable rank has a graph, recounted or not; ranks that did the same work share one
    for ranks in same_work({rank: groups.get(rank, []) for rank in whole}):
        page = _rank_page(ranks, groups.get(ranks[0], []), steps, world, options)
        graphs.append(page)
        rank_graphs.update((rank, page) for rank in ranks)
    setup = None
    if training is not None and split.other:
        rest = [g for rank in sorted(whole)
                for g in groups_outside(whole[rank], groups.get(rank, []))]
        setup = GraphPage("callgraphs/setup.html", "Call graph: setup and uncounted steps, "
                          f"{split.text(split.other)}",
                          _pruned(build_callgraph(rest, world=world), options),
                          "Step 0 runs from the start of the recording: building the model, "
                          "then the first iteration; a last step cut short by the end of the "
                          "recording is here too. Ops and time are summed over ranks.")
    tree = module_tree(merged)
    return ReportViews(
        functions=functions, zoomed=zoomed, graphs=graphs, setup=setup, zooms=zooms,
        module_zooms=_module_zooms(tree, merged, world, options), tree=tree,
        rank_trees={rank: module_tree(g) for rank, g in whole.items()},
        lines=source_lines(everything), paths=display_paths(files),
        source_pages=_slugs({f.file for g in everything for f in g.path if f is not NO_STACK}),
        split=split, training=merged, rank_graphs=rank_graphs)


def same_work(groups: dict) -> list:
    """Ranks (rank -> its op groups) that did the same work, lowest rank first in each list and
    lists in order of it: the same attribution paths, ops, phases, shapes, modules, counts, bytes
    and FLOPs; times may differ. The ranks of a data-parallel group usually do, so their call
    graphs are one graph drawn once."""
    out: dict = {}
    for rank in sorted(groups):
        out.setdefault(_work(groups[rank]), []).append(rank)
    return sorted(out.values())


def _work(groups: list) -> frozenset:
    """What a rank's groups say it did, less the times and the rank: a multiset of groups."""
    return frozenset(Counter((g.path, g.boundary, g.via, g.op, g.phase, g.kind, g.shapes,
                              g.module, g.count, g.bytes, g.flops) for g in groups).items())


def _rank_page(ranks: list, groups: list, steps: str, world: tuple,
               options: ReportOptions) -> GraphPage:
    """The call-graph page of ``ranks`` (the same work), drawn from the first one's groups."""
    first, graph = ranks[0], _pruned(build_callgraph(groups, world=world), options)
    if len(ranks) == 1:
        return GraphPage(f"callgraphs/rank-{first}.html", f"Call graph: rank {first}, {steps}",
                         graph, ranks=(first,))
    names = runs_text(ranks)
    return GraphPage(f"callgraphs/rank-{first}.html",
                     f"Call graph: ranks {names} (the same work), {steps}", graph,
                     f"Ranks {names} did the same work: the same call paths, ops, shapes, counts "
                     f"and bytes. The graph and its times are rank {first}'s; each rank's own "
                     "times are on its rank page.", ranks=tuple(ranks))


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
    for row in views.functions:
        out[row.file].append(dict(name=row.name, line=row.line, zoom=zoom_links.get(row.id),
                                  w=row.total))
    return out

