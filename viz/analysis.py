"""RunAnalysis: everything viz computes about a run, computed once and handed to every renderer.

    run = open_run("runs/tp2")
    analysis = analyse(run)            # per-rank map, then the cross-rank analyses
    summary.build_summary(analysis); report.build_report(analysis, ...); diff.diff_runs(a, b)

The map (:mod:`viz.rank`) reads each rank's trace twice, one rank at a time: first its sends and
receives (to match pipeline messages across ranks), then everything else. The cross-rank part
assembles the timeline (:mod:`viz.timeline`) and its metrics (:mod:`viz.metrics`) from the
per-rank results alone.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Optional

from tracer import TraceError

from .metrics import metrics_of
from .rank import analyse_rank_file, count_rank_file, p2p_of_file
from .run import Run, RunError
from .timeline import Timeline, assemble, match_p2p


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
    count_steps: Optional[frozenset] = None   # counts cover these steps only (trace-diff)
    config: dict = field(default_factory=dict)

    @property
    def missing(self) -> list:
        """Ranks of the world with no readable trace."""
        return [r for r in range(self.world_size) if r not in self.ranks]

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
        lines = []
        for rank in range(self.world_size):
            if rank in self.unreadable:
                lines.append(f"{self.unreadable[rank]}; rank {rank} is left out")
            elif rank not in self.ranks:
                lines.append(f"rank {rank}: no trace file in {self.run.traces_dir}")
            else:
                lines.extend(self.ranks[rank].warnings)
        return lines


def analyse(run: Run) -> RunAnalysis:
    """Analyse every rank of ``run`` (see the module docstring). Raises RunError when no trace
    is readable."""
    endpoints, unreadable = {}, {}
    for rank, path in run.files.items():
        try:
            endpoints[rank] = p2p_of_file(path, rank)
        except TraceError as exc:
            unreadable[rank] = str(exc)
    if not endpoints:
        raise RunError(f"{run.dir}: no readable trace: " + "; ".join(unreadable.values()))
    links, send_ends = match_p2p(endpoints)
    ranks = {rank: analyse_rank_file(run.files[rank], rank, send_ends.get(rank, {}))
             for rank in sorted(endpoints)}
    return _reduce(run, ranks, unreadable, links)


def _reduce(run: Run, ranks: dict, unreadable: dict, links: list) -> RunAnalysis:
    """The cross-rank analyses, from the per-rank results."""
    config = next((r.config for _, r in sorted(ranks.items()) if r.config), {})
    world = max([run.world_size_hint]
                + [int(r.meta.get("world_size", 1)) for r in ranks.values()])
    timeline = assemble({rank: r.lanes for rank, r in ranks.items()}, links, config)
    return RunAnalysis(run, world, ranks, unreadable, timeline, metrics_of(timeline),
                       config=config)



def recount(analysis: RunAnalysis, steps: frozenset) -> RunAnalysis:
    """The same analysis with its counts (op groups, op and communication counts) over
    ``steps`` only: runs are compared over the steps both recorded (trace-diff). The timeline
    and its metrics are kept as they are; each trace is read once more."""
    ranks = {}
    for rank, mine in analysis.ranks.items():
        counted = count_rank_file(mine.path, steps)
        ranks[rank] = replace(mine, groups=counted.groups, op_counts=counted.op_counts,
                              comm=counted.comm, steps=counted.steps)
    return replace(analysis, ranks=ranks, count_steps=steps)
