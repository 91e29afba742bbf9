"""RunAnalysis: everything viz computes about a run, computed once and handed to every view and
renderer (:mod:`.map_reduce` computes it).

Which ranks are where, as sets (no text: the views word them, :mod:`viz.views.problems`):

- ``ranks``: every rank whose trace was read; ``unreadable``: the others with a trace file;
- :meth:`RunAnalysis.with_files`: both; :meth:`RunAnalysis.absent`: runs of ranks of the
  world without a trace file;
- :meth:`RunAnalysis.listed`: ranks with a row of their own (a trace file, or an entry in
  run.json); :meth:`RunAnalysis.unlisted`: runs of the others;
- :meth:`RunAnalysis.missing`: runs of ranks without a readable trace.

Runs of ranks are (first, last) pairs: a world of 10^7 ranks beside 2 traces costs nothing per
absent rank.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

from tracer.files.run_record import RankOutcome
from tracer.vocab.strenum import StrEnum

from ..run import Run
from .crossrank.critical_path import Path
from .crossrank.dimensions import DimensionCost, GroupDimension
from .crossrank.matching import CrossRank
from .timeline.lanes import Timeline
from .timeline.metrics import RankMetrics

if TYPE_CHECKING:       # rank imports the timeline and device rooms: only its record's type
    from .rank import RankAnalysis

RankRun = tuple[int, int]             # (first, last) of a run of consecutive ranks


class RankVerdict(StrEnum):
    """A rank's status in summary.json (docs/architecture.md's contract)."""

    OK = "ok"
    FAILED = "failed"
    MISSING = "missing"           # no readable trace


@dataclass(frozen=True)
class WorldDisagreement:
    """run.json's ``world_size``, set aside because the traces disagree with it
    (:func:`.map_reduce.world_of`)."""

    claimed: int                      # what run.json says
    traces_say: bool                  # whether the traces said their world (else: a rank's file)
    highest_rank: int                 # the highest rank with a readable trace


@dataclass
class RunAnalysis:
    """A run's analyses. ``ranks`` holds every readable rank; ``unreadable`` the others that
    have a trace file, with the one-line reason."""

    run: Run
    world_size: int
    ranks: dict[int, RankAnalysis]    # rank -> its analysis
    unreadable: dict[int, str]        # rank -> why its trace could not be read
    timeline: Timeline
    metrics: dict[int, RankMetrics]
    cross: CrossRank                  # collectives matched across ranks
    paths: list[Path]                 # the critical path of each counted step
    count_steps: Optional[frozenset[int]] = None   # counts cover these steps only (trace-diff)
    config: dict[str, Any] = field(default_factory=dict)
    world_disagreement: Optional[WorldDisagreement] = None   # run.json's world set aside
    left_out: list[str] = field(default_factory=list)  # --kineto files that are no export (lines)
    # group text -> the dimension each group carries
    group_dimensions: dict[str, GroupDimension] = field(default_factory=dict)
    dimensions: dict[int, list[DimensionCost]] = field(default_factory=dict)   # by rank

    def missing(self) -> list[RankRun]:
        """(first, last) of each run of ranks without a readable trace: ranks of the world with
        none, and rank files outside the world (another run's) that could not be read."""
        readable = sorted(r for r in self.ranks if r < self.world_size)
        outside = sorted(r for r in self.unreadable if r >= self.world_size)
        return _gaps(readable, self.world_size) + [(r, r) for r in outside]

    @property
    def any_missing(self) -> bool:
        """Whether some rank of the world has no readable trace (bounded by the trace files)."""
        return bool(self.unreadable) or len(self.ranks) < self.world_size

    @property
    def imported(self) -> bool:
        """Whether every readable rank was imported from a torch.profiler export."""
        return bool(self.ranks) and all("imported" in r.meta for r in self.ranks.values())

    @property
    def recorded_steps(self) -> frozenset[int]:
        """Every step index some rank recorded."""
        return frozenset(s for mine in self.ranks.values() for s in mine.steps)

    def with_files(self) -> list[int]:
        """Ranks with a trace file, readable or not (in the world or not)."""
        return sorted(set(self.ranks) | set(self.unreadable))

    def absent(self) -> list[RankRun]:
        """(first, last) of each run of consecutive ranks of the world without any trace file;
        computed from the files, so a world of 10^7 ranks beside 2 traces is one pair."""
        return _gaps(self.with_files(), self.world_size)

    def listed(self) -> list[int]:
        """Ranks that get a row of their own: those with a trace file and those trace-run's
        run.json says something about (a rank that died before its tracer started), inside
        the world. The others are absent, listed as runs (:meth:`unlisted`)."""
        reported = {int(r) for r in (self.run.info.get("ranks") or {})
                    if int(r) < self.world_size}
        return sorted(set(self.with_files()) | reported)

    def unlisted(self) -> list[RankRun]:
        """(first, last) of each run of ranks of the world without a row (:meth:`listed`)."""
        return _gaps(self.listed(), self.world_size)

    def reported(self, rank: int) -> RankOutcome:
        """What trace-run's run.json says about ``rank`` ({} if nothing)."""
        return (self.run.info.get("ranks") or {}).get(str(rank)) or {}

    def status(self, rank: int) -> RankVerdict:
        """ok | failed | missing (docs/architecture.md's summary.json statuses)."""
        if rank not in self.ranks:
            return RankVerdict.MISSING
        reported = self.reported(rank)
        if reported.get("status") == "failed" or (reported.get("exit_code") not in (None, 0)):
            return RankVerdict.FAILED
        return RankVerdict.OK if self.ranks[rank].status == "ok" else RankVerdict.FAILED


def _gaps(present: list[int], world: int) -> list[RankRun]:
    """(first, last) of each run of ranks in ``range(world)`` not in ``present`` (sorted)."""
    out: list[RankRun] = []
    start = 0
    for rank in present:
        if rank >= world:
            break
        if rank > start:
            out.append((start, rank - 1))
        start = rank + 1
    if start < world:
        out.append((start, world - 1))
    return out
