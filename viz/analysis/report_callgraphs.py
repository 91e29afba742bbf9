"""The call graphs a report draws, chosen once from a :class:`~.run_analysis.RunAnalysis`: all
ranks merged, one per distinct rank work, the other steps, functions and modules zoomed in, each
pruned for reading; the module trees and what each source line issued beside them. Computed
once per report (:func:`report_callgraphs`); :mod:`viz.views.callgraph_pages` words them as pages.

Call graphs and the module view show the *training steps*: the steps the time metrics count
(:func:`.timeline.lanes.counted_steps`: step 0, which carries the model's construction and other
setup, and an unfinished last step are left out). :func:`training` counts each rank over them,
reading a trace again only where a rank's own counted steps differ. What the other steps did gets
one merged graph of its own (:func:`step_split`, :func:`groups_outside`). Source lines and the
ranks' own module trees cover the whole recording.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Optional

from ..engine import Engine
from .callgraphs.callgraph import (FUNCTION, HIDDEN, CallGraph, LineOps, build_callgraph,
                                   importance, prune, source_lines, total_of,
                                   trim_common_prefix)
from .callgraphs.module_tree import NO_MODULE, ModuleRow, module_tree
from .callgraphs.op_groups import NO_STACK, OpGroup, Weights
from .callgraphs.source_files import display_paths
from .map_reduce import recount
from .run_analysis import RunAnalysis

WHOLE_GRAPH = 0.9   # a function holding this share of every measure is nearly the whole graph


@dataclass(frozen=True)
class ReportOptions:
    """How much the report draws."""

    max_nodes: int = 150         # per SVG, notes of hidden nodes included
    min_share: float = 0.005     # nodes below this share of ops, time and bytes are hidden
    zoom_functions: int = 24     # functions that get their own zoomed call graph
    zoom_modules: int = 16       # modules that get their own call graph
    zoom_min_share: float = 0.02  # ... if they account for at least this share


# ------------------------------------------------------------------------------ the steps
@dataclass(frozen=True)
class StepSplit:
    """Which recorded steps the call graphs show (``counted``) and which go to the setup graph
    (``other``: empty when every step counts)."""

    counted: tuple[int, ...]
    other: tuple[int, ...]


def step_split(analysis: RunAnalysis) -> StepSplit:
    """The training steps (counted by any rank's time metrics) and the other recorded steps."""
    recorded = analysis.recorded_steps
    counted = frozenset(s for m in analysis.metrics.values() for s in m.counted_steps) & recorded
    counted = counted or recorded
    return StepSplit(tuple(sorted(counted)), tuple(sorted(recorded - counted)))


def to_recount(analysis: RunAnalysis, steps: frozenset[int]) -> set[int]:
    """Ranks whose own counted steps are not ``steps``: their groups over ``steps`` need one
    more read of their traces."""
    return {r for r, mine in analysis.ranks.items()
            if set(mine.counted_steps) != set(steps) & set(mine.steps)}


def recounts(analysis: RunAnalysis) -> bool:
    """Whether :func:`training` reads some rank's trace again."""
    split = step_split(analysis)
    return bool(split.other) and bool(to_recount(analysis, frozenset(split.counted)))


def training(analysis: RunAnalysis, engine: Optional[Engine] = None) -> Optional[RunAnalysis]:
    """The analysis with each rank's op groups over the training steps (:func:`step_split`),
    None when every recorded step is one: the groups each rank computed over its own counted
    steps where those are the training steps (the usual case, no trace read again), a recount
    on ``engine`` of the others."""
    split = step_split(analysis)
    if not split.other:
        return None
    steps = frozenset(split.counted)
    late = to_recount(analysis, steps)
    out = recount(replace(analysis, ranks={r: analysis.ranks[r] for r in sorted(late)}),
                  steps, engine).ranks if late else {}
    ranks = {r: out[r] if r in late else replace(mine, op_groups=mine.counted_op_groups)
             for r, mine in analysis.ranks.items() if r not in late or r in out}
    return replace(analysis, ranks=ranks, count_steps=steps)


_GROUP_KEY = ("rank", "path", "boundary", "via", "op", "phase", "kind", "shapes", "module")


def groups_outside(whole: Iterable[OpGroup], part: Iterable[OpGroup]) -> list[OpGroup]:
    """The op groups of ``whole`` (a rank's whole recording) less ``part`` (the same rank
    recounted over some of its steps, :func:`viz.analysis.recount`): what the other steps did.
    Several groups can share an attribution (stacks that differ in library frames only), so
    both sides are summed by attribution first."""
    def summed(groups: Iterable[OpGroup]) -> dict[tuple[Hashable, ...], OpGroup]:
        out: dict[tuple[Hashable, ...], OpGroup] = {}
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


# ------------------------------------------------------------------------------ the graphs
@dataclass(frozen=True)
class FunctionRow:
    """A function of a merged call graph, with everything it issued (all ranks)."""

    id: str
    file: str
    name: str
    line: int
    total: Weights


def function_rows(graph: CallGraph) -> list[FunctionRow]:
    """The function nodes of ``graph``, in its order."""
    return [FunctionRow(d.id, d.file, d.name, d.line, d.total) for d in graph.nodes(FUNCTION)]


@dataclass(frozen=True)
class RankWork:
    """Ranks that did the same work (:func:`same_work`), lowest first, and the one graph drawn
    for them: the first rank's, pruned."""

    ranks: tuple[int, ...]
    graph: CallGraph


@dataclass
class ReportCallGraphs:
    """The call graphs a report draws and what its pages read beside them. Every graph is kept
    pruned only: of the unpruned merged ones (tens of MiB for many ranks), just their
    functions."""

    split: StepSplit
    functions: list[FunctionRow]   # of the merged graph, whole recording
    merged: CallGraph         # training steps, all ranks merged
    # function node id -> its graph zoomed in (training steps), the biggest first
    zooms: dict[str, CallGraph]
    zoomed: dict[str, FunctionRow]   # function node id -> its row, training steps (zooms)
    rank_work: list[RankWork]  # every readable rank's, in order of their first rank
    setup: Optional[CallGraph]  # the other steps (setup, step 0, unfinished), all ranks merged
    module_zooms: dict[str, CallGraph]   # module path -> the graph of that subtree's ops
    tree: list[ModuleRow]     # all ranks (training steps)
    rank_trees: dict[int, list[ModuleRow]]   # rank -> its module tree (whole recording)
    lines: Mapping[str, Mapping[int, LineOps]]   # file -> line -> what it issued (whole)
    paths: dict[str, str]     # recorded file -> short display path
    source_files: frozenset[str]   # recorded files the op groups' paths run through
    training: list[OpGroup]   # the training steps', all ranks


def report_callgraphs(analysis: RunAnalysis, training: Optional[RunAnalysis] = None,
                      options: ReportOptions = ReportOptions()) -> ReportCallGraphs:
    """``training``: ``analysis`` over :func:`step_split`'s counted steps (:func:`training`;
    None: every recorded step counts, the analysis is the training steps)."""
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
    trained = full if training is None else build_callgraph(merged, world=world)
    del full
    shown = _pruned(trained, options)
    zooms = _function_zooms(trained, shown, merged, world, options)
    zoomed = {row.id: row for row in function_rows(trained) if row.id in zooms}
    del trained             # the rank graphs, setup graph and module zooms are built without it
    # every readable rank has a graph, recounted or not; ranks that did the same work share one
    rank_work = [RankWork(tuple(ranks), _pruned(build_callgraph(groups.get(ranks[0], []),
                                                                world=world), options))
                 for ranks in same_work({rank: groups.get(rank, []) for rank in whole})]
    setup = None
    if training is not None and split.other:
        rest = [g for rank in sorted(whole)
                for g in groups_outside(whole[rank], groups.get(rank, []))]
        setup = _pruned(build_callgraph(rest, world=world), options)
    tree = module_tree(merged)
    return ReportCallGraphs(
        split=split, functions=functions, merged=shown, zooms=zooms, zoomed=zoomed,
        rank_work=rank_work, setup=setup,
        module_zooms=_module_zooms(tree, merged, world, options), tree=tree,
        rank_trees={rank: module_tree(g) for rank, g in whole.items()},
        lines=source_lines(everything), paths=display_paths(files),
        source_files=frozenset(f.file for g in everything for f in g.path if f is not NO_STACK),
        training=merged)


def same_work(groups: Mapping[int, Sequence[OpGroup]]) -> list[list[int]]:
    """Ranks (rank -> its op groups) that did the same work, lowest rank first in each list and
    lists in order of it: the same attribution paths, ops, phases, shapes, modules, counts, bytes
    and FLOPs; times may differ. The ranks of a data-parallel group usually do, so their call
    graphs are one graph drawn once."""
    out: dict[frozenset[tuple[Hashable, int]], list[int]] = {}
    for rank in sorted(groups):
        out.setdefault(_work(groups[rank]), []).append(rank)
    return sorted(out.values())


def _work(groups: Iterable[OpGroup]) -> frozenset[tuple[Hashable, int]]:
    """What a rank's groups say it did, less the times and the rank: a multiset of groups."""
    return frozenset(Counter((g.path, g.boundary, g.via, g.op, g.phase, g.kind, g.shapes,
                              g.module, g.count, g.bytes, g.flops) for g in groups).items())


def _pruned(graph: CallGraph, options: ReportOptions) -> CallGraph:
    return prune(graph, max_nodes=options.max_nodes, min_share=options.min_share)


def _function_zooms(full: CallGraph, shown: CallGraph, merged: Sequence[OpGroup],
                    world: tuple[int, ...], options: ReportOptions) -> dict[str, CallGraph]:
    """Function node id -> that function's graph zoomed in (pruned). Worth it only for functions
    under which the merged graph (``shown``, pruned) hid something, and that are not nearly the
    whole graph already; the biggest first."""
    candidates = [full.node(n) for n in shown.graph
                  if shown.node(n).type == FUNCTION
                  and any(shown.node(c).type == HIDDEN for c in shown.graph.successors(n))
                  and options.zoom_min_share <= importance(full, full.node(n)) < WHOLE_GRAPH]
    candidates.sort(key=lambda d: (-importance(full, d), d.id))
    chosen = candidates[:options.zoom_functions]
    # Each zoom only needs the groups whose path runs through its function.
    keys = {(d.file, d.name) for d in chosen}
    through: defaultdict[tuple[str, str], list[OpGroup]] = defaultdict(list)
    for grp in merged:
        for key in {(f.file, f.qualname) for f in grp.path} & keys:
            through[key].append(grp)
    out: dict[str, CallGraph] = {}
    for data in chosen:
        key = (data.file, data.name)
        out[data.id] = _pruned(build_callgraph(through[key], world=world, root=key), options)
    return out


def _module_zooms(tree: Sequence[ModuleRow], merged: Sequence[OpGroup], world: tuple[int, ...],
                  options: ReportOptions) -> dict[str, CallGraph]:
    """Module path -> the graph of that module subtree's ops (pruned), the biggest modules of
    the top levels."""
    total = total_of(r.total for r in tree if r.depth == 0)
    rows = [r for r in tree if r.path != NO_MODULE and r.depth <= 3 and total.ops
            and r.total.ops / total.ops >= options.zoom_min_share]
    rows.sort(key=lambda r: (r.depth, -r.total.ops, r.path))
    out: dict[str, CallGraph] = {}
    for row in rows[:options.zoom_modules]:
        prefix = row.path + "."
        mine = [g for g in merged if g.module and (g.module == row.path
                                                    or g.module.startswith(prefix))]
        out[row.path] = _pruned(build_callgraph(trim_common_prefix(mine), world=world), options)
    return out
