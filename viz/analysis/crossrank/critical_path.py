"""The critical path of each step across ranks: the chain of compute, P2P and collective
dependencies that set the step's time.

Walk back from the end of the step on the rank that finished it last. While the rank was
computing, the path stays on it. Where it resumed because something completed, the path follows
what it waited for: a receive leads to its sender at the moment the send was posted (if the
sender was the late one), a collective to its last-arriving member at its arrival. Where nothing
completed, the rank was idle and the path says so. The walk ends at the rank's step start.

Each step's path is a list of :class:`Segment` s, latest first, whose lengths add up to the
step's time on the path; :meth:`Path.by_rank` and :meth:`Path.by_what` give the shares. Module
shares need each op's module, which only the trace has: :mod:`viz.analysis.rank` computes them
per rank for the segments that fall on it (:func:`module_time`). A pure function of the timeline
and the cross-rank matching; multi-rank critical paths are open work in HTA and TraceLens.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from tracer.vocab.strenum import StrEnum

from ..timeline.lanes import CommSpan, RankLanes, Timeline, counted_steps
from .matching import P2P, CrossRank, Matched


class SegmentKind(StrEnum):
    """What a rank was doing on a stretch of the path (summary.json's ``critical_path`` shares)."""

    COMPUTE = "compute"
    TRANSFER = "transfer"       # data in flight to this rank: it waited for a late one
    COMM = "comm"
    IDLE = "idle"


COMPUTE, TRANSFER, COMM, IDLE = (SegmentKind.COMPUTE, SegmentKind.TRANSFER, SegmentKind.COMM,
                                 SegmentKind.IDLE)
_MAX_SEGMENTS = 100_000          # per step: a bound against a malformed trace, never reached


@dataclass(frozen=True)
class Segment:
    """A stretch of the path on one rank."""

    rank: int
    start: int
    end: int
    what: SegmentKind
    detail: str = ""             # the communication it waited in, or where it jumped from

    @property
    def ns(self) -> int:
        return self.end - self.start


@dataclass
class Path:
    """One step's critical path, latest segment first."""

    step: int
    end_rank: int
    segments: list[Segment] = field(default_factory=list)
    modules: dict[str, int] = field(default_factory=dict)  # module path -> ns of compute on it

    @property
    def ns(self) -> int:
        return sum(s.ns for s in self.segments)

    def by_rank(self) -> dict[int, int]:
        out: defaultdict[int, int] = defaultdict(int)
        for s in self.segments:
            out[s.rank] += s.ns
        return dict(sorted(out.items()))

    def by_what(self) -> dict[SegmentKind, int]:
        out: defaultdict[SegmentKind, int] = defaultdict(int)
        for s in self.segments:
            out[s.what] += s.ns
        return dict(sorted(out.items()))


class _Rank:
    """One rank's lanes as sorted arrays for the walk."""

    def __init__(self, lane: RankLanes) -> None:
        self.lane = lane
        self.c_start, self.c_end = lane.compute[:, 0], lane.compute[:, 1]
        # positions of the rank's comm spans by end (columns: no span is made until asked for)
        self.by_end = np.argsort(lane.comm.column("end"), kind="stable")
        self.comm_ends = lane.comm.column("end")[self.by_end]
        self.comm_starts = lane.comm.column("start")[self.by_end]

    def computing_since(self, t: int) -> Optional[int]:
        """Start of the compute interval covering the instant just before ``t``, or None."""
        i = int(np.searchsorted(self.c_start, t, side="left")) - 1
        if i >= 0 and self.c_end[i] >= t:
            return int(self.c_start[i])
        return None

    def completed_at(self, t: int) -> Optional[CommSpan]:
        """A communication this rank saw complete at ``t`` (the latest-started), or None."""
        lo = int(np.searchsorted(self.comm_ends, t, side="left"))
        hi = int(np.searchsorted(self.comm_ends, t, side="right"))
        starts = self.comm_starts[lo:hi]
        done = np.nonzero(starts < t)[0]
        if not len(done):
            return None
        best = done[np.argmax(starts[done])]            # the latest-started, the first of ties
        return self.lane.comm[int(self.by_end[lo + best])]

    def last_activity_before(self, t: int) -> int:
        """The latest end of compute or communication before ``t`` (or -1)."""
        i = int(np.searchsorted(self.c_end, t, side="left")) - 1
        best = int(self.c_end[i]) if i >= 0 else -1
        j = int(np.searchsorted(self.comm_ends, t, side="left")) - 1
        return max(best, int(self.comm_ends[j]) if j >= 0 else -1)

    def send_start(self, index: int) -> int:
        """When the send of trace row ``index`` was posted (KeyError: no such send)."""
        at = self.lane.comm.find("index", index)
        span = self.lane.comm[at] if at >= 0 else None
        if span is None or span.kind != "send":
            raise KeyError(index)
        return span.start


def critical_paths(timeline: Timeline, cross: CrossRank) -> list[Path]:
    """The critical path of every step that some rank counted
    (viz.analysis.timeline.lanes.counted_steps)."""
    ranks = {r: _Rank(lane) for r, lane in timeline.ranks.items()}
    sender = {(link.dst, link.dst_index): (link.src, link.src_index) for link in timeline.links}
    matched = {(r, c.index): m for m in cross.matched for r, c in m.spans.items()}
    steps = sorted({s for lane in timeline.ranks.values() for s in counted_steps(lane)})
    out = []
    for step in steps:
        ends = {r: lane.steps[step][1] for r, lane in timeline.ranks.items() if step in lane.steps}
        if not ends:
            continue
        last = max(ends, key=lambda r: (ends[r], -r))
        path = Path(step, last)
        _walk(path, ranks, timeline, last, ends[last], sender, matched)
        out.append(path)
    return out


def _walk(path: Path, ranks: dict[int, _Rank], timeline: Timeline, rank: int, t: int,
          sender: dict[tuple[int, int], tuple[int, int]],
          matched: dict[tuple[int, int], Matched]) -> None:
    step = path.step
    segs = path.segments
    seen: set[tuple[int, int]] = set()   # (rank, t) jumped to: zero-length jumps never cycle
    while len(segs) < _MAX_SEGMENTS:
        lo = timeline.ranks[rank].steps.get(step, (t, t))[0]
        if t <= lo:
            return
        here = ranks[rank]
        since = here.computing_since(t)
        if since is not None:
            segs.append(Segment(rank, max(since, lo), t, COMPUTE))
            t = max(since, lo)
            continue
        c = here.completed_at(t)
        if c is None:
            before = max(here.last_activity_before(t), lo)
            segs.append(Segment(rank, before, t, IDLE))
            t = before
            continue
        src = sender.get((rank, c.index)) if c.kind == "recv" else None
        posted = ranks[src[0]].send_start(src[1]) if src is not None else None
        m = matched.get((rank, c.index)) if c.kind not in P2P else None
        if src is not None and posted is not None and max(c.start, lo) <= posted <= t \
                and (src[0], posted) not in seen:      # the sender was the late one
            _add(segs, Segment(rank, posted, t, TRANSFER, f"recv from rank {src[0]}"))
            rank, t = src[0], posted
            seen.add((rank, t))
        elif m is not None and m.last_rank != rank and max(c.start, lo) <= m.last_arrival <= t \
                and (m.last_rank, m.last_arrival) not in seen:
            _add(segs, Segment(rank, m.last_arrival, t, TRANSFER,
                               f"{c.kind} waiting for rank {m.last_rank}"))
            rank, t = m.last_rank, m.last_arrival
            seen.add((rank, t))
        else:
            start = max(c.start, lo)
            segs.append(Segment(rank, start, t, COMM, c.kind))
            t = start


def _add(segs: list[Segment], segment: Segment) -> None:
    if segment.ns > 0:
        segs.append(segment)


def path_intervals(paths: Sequence[Path]) -> dict[int, list[tuple[int, int, int]]]:
    """rank -> [(step, start, end)] of the compute segments on the paths."""
    out: defaultdict[int, list[tuple[int, int, int]]] = defaultdict(list)
    for p in paths:
        for s in p.segments:
            if s.what == COMPUTE:
                out[s.rank].append((p.step, s.start, s.end))
    return dict(out)
