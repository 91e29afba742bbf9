"""RunAnalysis: everything viz computes about a run, computed once and handed to every renderer.

    run = open_run("runs/tp2")
    analysis = analyse(run)            # per-rank map, then the cross-rank analyses
    summary.build_summary(analysis); report.build_report(analysis, ...); diff.diff_runs(a, b)

The map (:mod:`viz.rank`) reads each rank's trace twice, one rank per task: first its sends and
receives (to match pipeline messages across ranks), then everything else. Tasks run where the
:class:`viz.engine.Engine` says (this process, worker processes, a Dask cluster), so memory holds
one trace per worker. The cross-rank part assembles the timeline (:mod:`viz.timeline`) and its
metrics (:mod:`viz.metrics`) from the per-rank results alone.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Optional

from tracer import TraceError, rundir

from .columns import Records
from .critical_path import critical_paths, path_intervals
from .crossrank import CrossRank, cross_rank
from ..engine import Engine
from .op_groups import SharedOpGroups
from .metrics import metrics_of
from .rank import analyse_rank_file, count_rank_file, p2p_of_file, path_modules_file
from ..run import Run, RunError
from .lanes import P2PLink, Timeline
from .rank_lanes import DRAWN_OPS, assemble, match_p2p


@dataclass
class RunAnalysis:
    """A run's analyses. ``ranks`` holds every readable rank; ``unreadable`` the others that
    have a trace file, with the one-line reason."""

    run: Run
    world_size: int
    ranks: dict                       # rank -> RankAnalysis
    unreadable: dict                  # rank -> why its trace could not be read
    timeline: Timeline
    metrics: dict                     # rank -> viz.metrics.RankMetrics
    cross: CrossRank                  # collectives matched across ranks
    paths: list                       # viz.critical_path.Path of each counted step
    count_steps: Optional[frozenset] = None   # counts cover these steps only (trace-diff)
    config: dict = field(default_factory=dict)
    world_note: Optional[str] = None  # why the world is not what run.json says (world_of)
    left_out: list = field(default_factory=list)  # --kineto files that are no export (lines)

    @property
    def missing(self) -> list:
        """Ranks of the world with no readable trace, and rank files outside the world (files of
        another run) that could not be used. NOTE: one entry per rank of the world: callers
        that only need to know whether any is missing use :attr:`any_missing`."""
        return sorted({r for r in range(self.world_size) if r not in self.ranks}
                      | set(self.unreadable))

    @property
    def any_missing(self) -> bool:
        """Whether some rank of the world has no readable trace (bounded by the trace files)."""
        return bool(self.unreadable) or len(self.ranks) < self.world_size

    def absent(self) -> list:
        """(first, last) of each run of consecutive ranks of the world without any trace file;
        computed from the files, so a world of 10^7 ranks beside 2 traces is one pair."""
        return _gaps(self.with_files(), self.world_size)

    def listed(self) -> list:
        """Ranks that get a row of their own: those with a trace file and those trace-run's
        run.json says something about (a rank that died before its tracer started), inside
        the world. The others are absent, listed as runs (:meth:`unlisted`)."""
        reported = {int(r) for r in (self.run.info.get("ranks") or {})
                    if int(r) < self.world_size}
        return sorted(set(self.with_files()) | reported)

    def unlisted(self) -> list:
        """(first, last) of each run of ranks of the world without a row (:meth:`listed`)."""
        return _gaps(self.listed(), self.world_size)

    def status(self, rank: int) -> str:
        """ok | failed | missing (DESIGN.md's summary.json statuses)."""
        if rank not in self.ranks:
            return "missing"
        reported = (self.run.info.get("ranks") or {}).get(str(rank)) or {}
        if reported.get("status") == "failed" or (reported.get("exit_code") not in (None, 0)):
            return "failed"
        return "ok" if self.ranks[rank].status == "ok" else "failed"

    def error(self, rank: int) -> Optional[str]:
        """Why a rank failed, as recorded by the tracer or trace-run."""
        reported = (self.run.info.get("ranks") or {}).get(str(rank)) or {}
        if reported.get("error"):
            return reported["error"]
        if rank in self.ranks:
            mine = self.ranks[rank]
            if mine.meta.get("error"):
                return mine.meta["error"]
            if mine.status == "running":
                return "the rank ended without closing its trace (killed?)"
        return self.unreadable.get(rank)

    def damage(self) -> list:
        """One line per trace that is missing, unreadable or damaged: the file, what is wrong,
        what was kept."""
        return [line for rank in self.with_files() for line in self.damage_of(rank)] \
            + self.absent_lines()

    def with_files(self) -> list:
        """Ranks with a trace file, readable or not (in the world or not)."""
        return sorted(set(self.ranks) | set(self.unreadable))

    def absent_runs(self) -> list:
        """``rank 3``, ``ranks 2-999``: each run of consecutive ranks without a trace file (a
        world of 1,000 ranks beside 2 traces is one line, not 998)."""
        return [ranks_text(first, last) for first, last in self.absent()]

    def absent_lines(self) -> list:
        """What a user is told about the world: the note on its size (:func:`world_of`), then
        each run of ranks without a trace file (or without an export, for an import)."""
        imported = self.ranks and all("imported" in r.meta for r in self.ranks.values())
        where = "no torch.profiler export given (--kineto)" if imported else \
            f"no trace file in {self.run.traces_dir}"
        return ([self.world_note] if self.world_note else []) + \
            [f"{ranks}: {where}" for ranks in self.absent_runs()]

    def damage_of(self, rank: int) -> list:
        """:meth:`damage`'s lines about ``rank``."""
        if rank in self.unreadable:
            return [f"{self.unreadable[rank]}; rank {rank} is left out"]
        if rank not in self.ranks:
            return [f"rank {rank}: no trace file in {self.run.traces_dir}"]
        return list(self.ranks[rank].warnings)


def _gaps(present: list, world: int) -> list:
    """(first, last) of each run of ranks in ``range(world)`` not in ``present`` (sorted)."""
    out, start = [], 0
    for rank in present:
        if rank >= world:
            break
        if rank > start:
            out.append((start, rank - 1))
        start = rank + 1
    if start < world:
        out.append((start, world - 1))
    return out


def ranks_text(first: int, last: int) -> str:
    return f"rank {first}" if first == last else f"ranks {first}-{last}"


def analyse(run: Run, engine: Optional[Engine] = None, kineto: Optional[dict] = None
            ) -> RunAnalysis:
    """Analyse every rank of ``run`` (see the module docstring) on ``engine`` (default: this
    process); ``kineto``: rank -> torch.profiler exports to merge into its GPU activity.
    Raises RunError when no trace is readable."""
    kineto = kineto or {}
    engine = engine or Engine(jobs=1)
    engine.plan(run.files)
    ranks = sorted(run.files)
    endpoints, unreadable = _split(ranks, engine.map(p2p_of_file, [(run.files[r], r)
                                                                   for r in ranks]))
    if not endpoints:
        raise RunError(f"{run.dir}: no readable trace: " + "; ".join(unreadable.values()))
    links, send_ends = match_p2p(endpoints)
    links = Records.of(P2PLink, links)
    readable = sorted(endpoints)
    del endpoints           # every rank's sends and receives: freed before the results come
    budget = max(DRAWN_OPS // len(run.files), 1_000)
    shared = SharedOpGroups()
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
    found, _ = _split(order, engine.map(path_modules_file, [
        (analysis.ranks[r].path, r, on_path[r]) for r in order]))
    for path in analysis.paths:
        for rank_modules in found.values():
            for module, ns in rank_modules.get(path.step, {}).items():
                path.modules[module] = path.modules.get(module, 0) + ns


def _shared(result, shared: SharedOpGroups):
    """A rank's result (RankAnalysis or RankCounts) with its op groups on the frames and names
    ``shared`` holds (one copy for all ranks); an unreadable trace's error as it is."""
    if isinstance(result, TraceError):
        return result
    whole = shared.of(result.op_groups)
    if hasattr(result, "counted_op_groups"):
        result.counted_op_groups = whole if result.counted_op_groups is result.op_groups else \
            shared.of(result.counted_op_groups)
    result.op_groups = whole
    return result


def _split(ranks: list, results: list) -> tuple:
    """(rank -> result, rank -> why its trace was unreadable) of an engine's map."""
    good, bad = {}, {}
    for rank, result in zip(ranks, results):
        if isinstance(result, TraceError):
            bad[rank] = str(result)
        else:
            good[rank] = result
    return good, bad


def _reduce(run: Run, ranks: dict, unreadable: dict, links: list) -> RunAnalysis:
    """The cross-rank analyses, from the per-rank results."""
    config = next((r.config for _, r in sorted(ranks.items()) if r.config), {})
    world, note = world_of(run, ranks)
    timeline = assemble({rank: r.lanes for rank, r in ranks.items()}, links, config, world)
    cross = cross_rank(timeline)
    return RunAnalysis(run, world, ranks, unreadable, timeline, metrics_of(timeline), cross,
                       critical_paths(timeline, cross), config=config, world_note=note)


def world_of(run: Run, ranks: dict) -> tuple:
    """(the world size, a one-line note or None). The readable traces say their world in their
    metadata (the recorder takes it from the process group); run.json's ``world_size`` counts
    where it agrees with them, or where they say nothing, and is otherwise named and set aside:
    a 20-byte run.json saying 1,000,000 beside 2 traces of a world of 2 is not a world of a
    million absent ranks. A stray rank-100000.arrow that cannot be read is no evidence either.
    Nothing here, nor in the pages, costs anything per absent rank."""
    said = sorted({size for r in ranks.values()
                   if isinstance(size := r.meta.get("world_size"), int) and size >= 1})
    least = max(ranks) + 1
    recorded = max(said + [least])
    claimed = run.info.get("world_size")
    if claimed is None or (claimed in said and claimed >= least) or (not said and claimed >= least):
        return claimed or recorded, None
    where = os.path.join(run.dir, rundir.RUN_RECORD)
    theirs = f"the traces say {recorded}" if said else f"a trace of rank {least - 1} is there"
    return recorded, f"{where}: world_size {claimed} does not match the traces ({theirs}); " \
        f"the report uses {recorded}"



def recount(analysis: RunAnalysis, steps: frozenset,
            engine: Optional[Engine] = None) -> RunAnalysis:
    """The same analysis with its counts (op groups, op and communication counts) over
    ``steps`` only: runs are compared over the steps both recorded (trace-diff). The timeline
    and its metrics are kept as they are; each trace is read once more."""
    engine = engine or Engine(jobs=1)
    order = sorted(analysis.ranks)
    shared = SharedOpGroups()
    counts, _ = _split(order, engine.map(count_rank_file, [
        (analysis.ranks[r].path, r, steps, analysis.ranks[r].exports,
         analysis.ranks[r].send_caps) for r in order],
        then=lambda result: _shared(result, shared)))
    ranks = {rank: replace(mine, op_groups=counts[rank].op_groups, op_counts=counts[rank].op_counts,
                           op_counts_by_phase=counts[rank].op_counts_by_phase,
                           comm=counts[rank].comm, steps=counts[rank].steps)
             for rank, mine in analysis.ranks.items() if rank in counts}
    return replace(analysis, ranks=ranks, count_steps=steps)


def to_recount(analysis: RunAnalysis, steps: frozenset) -> set:
    """Ranks whose own counted steps are not ``steps``: their groups over ``steps`` need one
    more read of their traces."""
    return {r for r, mine in analysis.ranks.items()
            if set(mine.counted_steps) != set(steps) & set(mine.steps)}


def training(analysis: RunAnalysis, steps: frozenset,
             engine: Optional[Engine] = None) -> RunAnalysis:
    """The analysis with each rank's op groups over ``steps`` (the training steps the call
    graphs show): the groups each rank computed over its own counted steps where those are
    ``steps`` (the usual case, no trace read again), a recount of the others."""
    late = to_recount(analysis, steps)
    out = recount(replace(analysis, ranks={r: analysis.ranks[r] for r in sorted(late)}),
                  steps, engine).ranks if late else {}
    ranks = {r: out[r] if r in late else replace(mine, op_groups=mine.counted_op_groups)
             for r, mine in analysis.ranks.items() if r not in late or r in out}
    return replace(analysis, ranks=ranks, count_steps=steps)
