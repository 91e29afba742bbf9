"""The map and the reduce that compute a :class:`~.run_analysis.RunAnalysis`.

    analysis = analyse(open_run("runs/tp2"), engine)

The map (:mod:`.rank`) reads each rank's trace twice, one rank per task: first its sends and
receives (to match pipeline messages across ranks, :func:`.timeline.assemble.match_p2p`), then
everything else. Tasks run where the :class:`viz.engine.Engine` says (this process, worker
processes, a Dask cluster), so memory holds one trace per worker. The reduce assembles the timeline
(:mod:`.timeline.assemble`), its metrics (:mod:`.timeline.metrics`), the cross-rank matching
(:mod:`.crossrank.matching`), the critical paths (:mod:`.crossrank.critical_path`) and the parallel
dimensions' costs (:mod:`.crossrank.dimensions`) from the per-rank results alone; a third pass
reads only the ranks a critical path crosses, for its module shares. :func:`recount` counts
some steps only (trace-diff; the report's call graphs, :mod:`.report_callgraphs`).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Optional, TypeVar, Union

from tracer.files.format import TraceError
from tracer.vocab.groups import group_text

from ..engine import Engine
from ..run import Run, RunError
from .callgraphs.op_groups import SharedOpGroups
from .crossrank.critical_path import critical_paths, path_intervals
from .crossrank.dimensions import dimension_costs, group_names, name_groups
from .crossrank.matching import cross_rank
from .rank import (RankAnalysis, RankCounts, analyse_rank_file, count_rank_file, p2p_of_file,
                   path_modules_file)
from .run_analysis import RunAnalysis, WorldDisagreement
from .timeline.assemble import assemble, match_p2p
from .timeline.columns import Records
from .timeline.grid import grid_of
from .timeline.lanes import P2PEnd, P2PLink
from .timeline.metrics import metrics_of
from .timeline.rank_lanes import DRAWN_OPS

_R = TypeVar("_R")
_Counted = TypeVar("_Counted", RankAnalysis, RankCounts)


def analyse(run: Run, engine: Optional[Engine] = None,
            kineto: Optional[Mapping[int, Sequence[str]]] = None) -> RunAnalysis:
    """Analyse every rank of ``run`` (see the module docstring) on ``engine`` (default: this
    process); ``kineto``: rank -> torch.profiler exports to merge into its GPU activity.
    Raises RunError when no trace is readable."""
    kineto = kineto or {}
    engine = engine or Engine(jobs=1)
    engine.plan(run.files)
    ranks = sorted(run.files)
    endpoints: dict[int, Records[P2PEnd]]
    endpoints, unreadable = _split(ranks, engine.map(p2p_of_file, [(run.files[r], r)
                                                                   for r in ranks]))
    if not endpoints:
        raise RunError(f"{run.dir}: no readable trace: " + "; ".join(unreadable.values()))
    matched, send_ends = match_p2p(endpoints)
    links = Records.of(P2PLink, matched)
    readable = sorted(endpoints)
    del endpoints           # every rank's sends and receives: freed before the results come
    budget = max(DRAWN_OPS // len(run.files), 1_000)
    shared = SharedOpGroups()
    analysed: dict[int, RankAnalysis]
    analysed, late = _split(readable, engine.map(analyse_rank_file, [
        (run.files[r], r, send_ends.get(r, {}), budget, tuple(kineto.get(r, ())))
        for r in readable], then=lambda result: _shared(result, shared)))
    analysis = _reduce(run, analysed, {**unreadable, **late}, links)
    _path_modules(analysis, engine)
    return analysis


def _path_modules(analysis: RunAnalysis, engine: Engine) -> None:
    """Module shares of the critical paths: one more pass over the traces the paths cross."""
    on_path = path_intervals(analysis.paths)
    order = sorted(on_path)
    found: dict[int, dict[int, dict[str, int]]]
    found, _ = _split(order, engine.map(path_modules_file, [
        (analysis.ranks[r].path, r, on_path[r]) for r in order]))
    for path in analysis.paths:
        for rank_modules in found.values():
            for module, ns in rank_modules.get(path.step, {}).items():
                path.modules[module] = path.modules.get(module, 0) + ns


def _shared(result: Union[_Counted, TraceError], shared: SharedOpGroups
            ) -> Union[_Counted, TraceError]:
    """A rank's result (RankAnalysis or RankCounts) with its op groups on the frames and names
    ``shared`` holds (one copy for all ranks); an unreadable trace's error as it is."""
    if isinstance(result, TraceError):
        return result
    whole = shared.of(result.op_groups)
    if isinstance(result, RankAnalysis):
        result.counted_op_groups = whole if result.counted_op_groups is result.op_groups else \
            shared.of(result.counted_op_groups)
    result.op_groups = whole
    return result


def _split(ranks: Sequence[int], results: Sequence[Union[_R, TraceError]]
           ) -> tuple[dict[int, _R], dict[int, str]]:
    """(rank -> result, rank -> why its trace was unreadable) of an engine's map."""
    good: dict[int, _R] = {}
    bad: dict[int, str] = {}
    for rank, result in zip(ranks, results):
        if isinstance(result, TraceError):
            bad[rank] = str(result)
        else:
            good[rank] = result
    return good, bad


def _reduce(run: Run, ranks: dict[int, RankAnalysis], unreadable: dict[int, str],
            links: Records[P2PLink]) -> RunAnalysis:
    """The cross-rank analyses, from the per-rank results."""
    config: dict[str, Any] = next((r.config for _, r in sorted(ranks.items()) if r.config), {})
    world, disagreement = world_of(run, ranks)
    timeline = assemble({rank: r.lanes for rank, r in ranks.items()}, links, config, world)
    cross = cross_rank(timeline)
    texts = {t for lane in timeline.ranks.values() for t in lane.comm.tables.get("group", [])}
    texts |= {group_text(c.group, name=c.process_group) for r in ranks.values() for c in r.comm}
    names = name_groups(sorted(texts), group_names(r.meta for r in ranks.values()),
                        grid_of(config, world), world)
    return RunAnalysis(run, world, ranks, unreadable, timeline, metrics_of(timeline), cross,
                       critical_paths(timeline, cross), config=config,
                       world_disagreement=disagreement, group_dimensions=names,
                       dimensions=dimension_costs(timeline, names))


def world_of(run: Run, ranks: Mapping[int, RankAnalysis]
             ) -> tuple[int, Optional[WorldDisagreement]]:
    """(the world size, a :class:`WorldDisagreement` or None). The readable traces say their
    world in their metadata (the recorder takes it from the process group); run.json's
    ``world_size`` counts where it agrees with them, or where they say nothing, and is otherwise
    set aside (the views say so): a 20-byte run.json saying 1,000,000 beside 2 traces of a world
    of 2 is not a world of a million absent ranks. A stray rank-100000.arrow that cannot be read
    is no evidence either. Nothing here, nor in the pages, costs anything per absent rank."""
    said = sorted({size for r in ranks.values()
                   if isinstance(size := r.meta.get("world_size"), int) and size >= 1})
    least = max(ranks) + 1
    recorded = max(said + [least])
    claimed = run.info.get("world_size")
    if claimed is None or (claimed in said and claimed >= least) or (not said and claimed >= least):
        return claimed or recorded, None
    return recorded, WorldDisagreement(claimed, bool(said), least - 1)


def recount(analysis: RunAnalysis, steps: frozenset[int],
            engine: Optional[Engine] = None) -> RunAnalysis:
    """The same analysis with its counts (op groups, op and communication counts) over
    ``steps`` only: runs are compared over the steps both count (trace-diff). The timeline
    and its metrics are kept as they are. A rank whose own counted steps are ``steps`` keeps
    the counts it made of them while it was read; only the others' traces are read again."""
    engine = engine or Engine(jobs=1)
    kept = {r: mine.counted_counts for r, mine in analysis.ranks.items()
            if mine.counted_counts is not None
            and set(mine.counted_steps) == set(steps) & set(mine.steps)}
    order = sorted(set(analysis.ranks) - set(kept))
    shared = SharedOpGroups()
    counts: dict[int, RankCounts]
    counts, _ = _split(order, engine.map(count_rank_file, [
        (analysis.ranks[r].path, r, steps, analysis.ranks[r].exports,
         analysis.ranks[r].send_caps) for r in order],
        then=lambda result: _shared(result, shared))) if order else ({}, None)
    counts.update(kept)
    ranks = {rank: replace(mine, op_groups=counts[rank].op_groups,
                           op_counts=counts[rank].op_counts,
                           op_counts_by_phase=counts[rank].op_counts_by_phase,
                           comm=counts[rank].comm, steps=counts[rank].steps)
             for rank, mine in analysis.ranks.items() if rank in counts}
    return replace(analysis, ranks=ranks, count_steps=steps)
