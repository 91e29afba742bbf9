"""Across ranks: every collective matched over its process group, who arrived last and how long
the others waited, how long the transfer took and at what bandwidth, and where ranks disagree.

Matching follows PyTorch's Flight Recorder: a collective is identified by (process group,
per-group sequence number), which every member numbers alike. For each matched collective:

- arrival skew: the last member's launch minus the first's; the last rank to arrive;
- each member's wait: from its own launch to the last arrival (it could not finish earlier);
- transfer: from the last arrival to the earliest completion among the members;
- bandwidth as nccl-tests defines it: algbw = S / transfer, busbw = algbw x factor, with S the
  collective's size (:func:`matched_size`: one rule per kind, read from every member's bytes,
  so whoever arrived last, the same) and factor 2(n-1)/n for all_reduce, (n-1)/n for
  all_gather, reduce_scatter, all_to_all, gather and scatter, 1 for broadcast and reduce.

Mismatches (Flight Recorder's classes): members that issued a different kind, size or dtype at
the same (group, seq), and members that never issued it (missing ranks: the usual hang). Ranks
without a readable trace are not compared; a rank that stopped early (it failed or was
interrupted, was killed, or its file is truncated) and issued nothing more in the group is
"unknown" for the collectives it never reached, a consequence of the stop rather than a
disagreement: not missing. Whether the others launched them before or after it stopped does not
matter (that race made the verdict change from run to run). P2P is matched by (sender, receiver,
per-pair order) in :func:`viz.analysis.timeline.assemble.match_p2p`; unmatched sends and receives
are counted here.

All times are on rank 0's clock (host clocks aligned by the recorder). A pure function of the
timeline (:mod:`viz.analysis.timeline.assemble`), which carries each collective's group, sequence
number, dtype and source line.
"""
from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Optional, TypeVar

from tracer.vocab.groups import group_ranks
from tracer.vocab.ops import P2P_KINDS
from tracer.vocab.strenum import StrEnum

from ..callgraphs.op_groups import SLOTS, Frame
from ..timeline.lanes import CommSpan, RankLanes, Timeline

P2P = P2P_KINDS       # the kinds matched by peer, not by group
_UNSIZED = ("barrier",)
_H = TypeVar("_H", bound=Hashable)


def bus_factor(kind: str, n: int) -> float:
    """nccl-tests' bus-bandwidth factor of a collective over ``n`` ranks."""
    if n < 2:
        return 0.0
    if kind == "all_reduce":
        return 2 * (n - 1) / n
    if kind in ("broadcast", "reduce"):
        return 1.0
    return (n - 1) / n


def collective_size(kind: str, nbytes: int, n: int) -> int:
    """S from what one rank hands in: all_gather's output, else that rank's input (the same on
    every member but for rooted kinds and all_to_all: :func:`matched_size`)."""
    return nbytes * n if kind == "all_gather" else nbytes


def matched_size(kind: str, handed: dict[int, int], n: int, root: Optional[int] = None) -> int:
    """S, the size of a matched collective for bandwidth, as nccl-tests sizes it, from
    ``handed`` (member rank -> the bytes it handed in; whoever arrived last, the same S):

    - all_gather and gather: the gathered output, n x what a member hands in (gather's root
      receives it);
    - scatter: what the root hands in, its n chunks (its receivers hand none; the member that
      handed most where the root is unknown);
    - all_to_all: the members' mean (splits may be uneven);
    - all_reduce, reduce_scatter (its full input), broadcast and reduce: what a member hands
      in (every member alike, else the members disagree on the size and nothing is matched).
    """
    if not handed:
        return 0
    if kind == "scatter":
        return handed[root] if root in handed else max(handed.values())
    if kind == "all_to_all":
        return sum(handed.values()) // len(handed)
    most = max(handed.values())
    return most * n if kind in ("all_gather", "gather") else most


@dataclass(frozen=True, **SLOTS)
class Matched:
    """One collective, matched over its group."""

    group: str
    seq: int
    kind: str
    step: int
    spans: dict[int, CommSpan]   # rank -> its call
    last_rank: int
    first_arrival: int
    last_arrival: int
    end: int                     # earliest completion after the last arrival
    size: int                    # S (bytes), for bandwidth
    n: int                       # group size

    @property
    def skew_ns(self) -> int:
        return self.last_arrival - self.first_arrival

    @property
    def transfer_ns(self) -> int:
        return max(self.end - self.last_arrival, 0)

    def wait_ns(self, rank: int) -> int:
        return self.last_arrival - self.spans[rank].start

    @property
    def late_ns(self) -> int:
        """How much later than every other member the last one arrived."""
        others = [c.start for r, c in self.spans.items() if r != self.last_rank]
        return self.last_arrival - max(others) if others else 0

    @property
    def algbw(self) -> Optional[float]:
        """Bytes per second; None for a zero transfer or a size-less collective."""
        return self.size / (self.transfer_ns / 1e9) if self.transfer_ns > 0 and self.size else None

    @property
    def site(self) -> Optional[Frame]:
        """The source line the last rank issued it from (the one everyone waited for)."""
        return self.spans[self.last_rank].site


class MismatchKind(StrEnum):
    """What the members of a group disagree on (Flight Recorder's classes; the module doc)."""

    KIND = "kind"
    SIZE = "size"
    DTYPE = "dtype"
    MISSING = "missing"          # members that never issued it
    UNKNOWN = "unknown"          # members that stopped early, before it: not a disagreement


# who issued what, from where: (value, ranks, their sites); the value None for the absent
Side = tuple[Any, tuple[int, ...], tuple[Optional[Frame], ...]]


@dataclass(frozen=True)
class Mismatch:
    """Members of a group that disagree about the collective at one sequence number."""

    group: str
    seq: int
    what: MismatchKind
    sides: tuple[Side, ...]


@dataclass
class CrossRank:
    """Everything matched across ranks."""

    matched: list[Matched] = field(default_factory=list)    # by first arrival
    unmatched: int = 0           # calls whose group members could not all be found
    unmatched_p2p: int = 0
    mismatches: list[Mismatch] = field(default_factory=list)  # by group and seq
    wait_ns: dict[int, int] = field(default_factory=dict)   # rank -> total wait
    late_ns: dict[int, int] = field(default_factory=dict)   # rank -> time others waited on it
    wait_by_step: dict[tuple[int, int], int] = field(default_factory=dict)  # (rank, step)->wait

    def stragglers(self) -> list[tuple[int, float]]:
        """(rank, late seconds), most late first: ranks the others waited for."""
        return sorted(((r, ns / 1e9) for r, ns in self.late_ns.items() if ns > 0),
                      key=lambda x: (-x[1], x[0]))

    def collectives(self) -> list[CollectiveStats]:
        """Per (kind, group), a :class:`CollectiveStats`: count, bytes (sum of S), median
        transfer, bandwidths, the source line that issued most of them."""
        rows: defaultdict[tuple[str, str], list[Matched]] = defaultdict(list)
        for m in self.matched:
            if m.kind not in _UNSIZED:
                rows[(m.kind, m.group)].append(m)
        out = []
        for (kind, group), calls in sorted(rows.items()):
            total = sum(m.size for m in calls)
            transfer = sum(m.transfer_ns for m in calls) / 1e9
            algbw = total / transfer / 1e9 if transfer > 0 and total else None
            out.append(CollectiveStats(
                kind, group, len(calls), total,
                statistics.median(m.transfer_ns for m in calls) / 1e9, algbw,
                algbw * bus_factor(kind, calls[0].n) if algbw else None,
                _commonest(m.site for m in calls)))
        return out


@dataclass(frozen=True)
class CollectiveStats:
    """The matched collectives of one kind over one process group."""

    kind: str
    group: str                   # the recorded process group text (tracer.vocab.groups.group_text)
    count: int
    bytes: int                   # sum of S
    median_s: float              # median transfer
    algbw_GBps: Optional[float]
    busbw_GBps: Optional[float]
    site: Optional[Frame]        # the commonest source line


def cross_rank(timeline: Timeline) -> CrossRank:
    """Match every collective of ``timeline`` across its group (see the module docstring)."""
    present = set(timeline.ranks)
    calls: defaultdict[tuple[str, int], dict[int, CommSpan]] = defaultdict(dict)  # (group, seq)
    last_seq: dict[tuple[int, str], int] = {}  # (rank, group) -> its last collective's seq
    p2p = 0
    for rank, lane in timeline.ranks.items():
        # read from the columns: only the collectives become CommSpans (P2P is most spans)
        for i, (kind, seq, group) in enumerate(zip(lane.comm.values("kind"),
                                                   lane.comm.values("seq"),
                                                   lane.comm.values("group"))):
            if kind in P2P:
                p2p += 1
            elif seq is not None and group:
                calls[(group, seq)][rank] = lane.comm[i]
                last_seq[(rank, group)] = max(last_seq.get((rank, group), -1), seq)
    out = CrossRank(unmatched_p2p=p2p - 2 * len(timeline.links))
    for (group, seq), spans in sorted(calls.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        members = group_ranks(group)
        if len(members) == 1:
            continue                 # a group of one has nothing to match
        readable = {r: timeline.ranks[r] for r in members if r in present}
        ended = {r for r in readable if readable[r].stopped
                 and seq > last_seq.get((r, group), -1)}
        problem = _disagreement(group, seq, spans, readable, ended)
        if problem is not None:
            out.mismatches.append(problem)
        if problem is not None or not members or len(readable) < len(members) \
                or len(spans) < 2:
            out.unmatched += len(spans)
            continue
        out.matched.append(_match(group, seq, spans))
    out.matched.sort(key=lambda m: m.first_arrival)
    for m in out.matched:
        for rank in m.spans:
            wait = m.wait_ns(rank)
            out.wait_ns[rank] = out.wait_ns.get(rank, 0) + wait
            key = (rank, m.step)
            out.wait_by_step[key] = out.wait_by_step.get(key, 0) + wait
        out.late_ns[m.last_rank] = out.late_ns.get(m.last_rank, 0) + m.late_ns
    for rank in present:
        out.wait_ns.setdefault(rank, 0)
        out.late_ns.setdefault(rank, 0)
    return out


def _match(group: str, seq: int, spans: dict[int, CommSpan]) -> Matched:
    last_rank = max(spans, key=lambda r: (spans[r].start, r))
    last = spans[last_rank].start
    ends = [c.end for c in spans.values() if c.completed]
    end = min(ends) if ends else max(c.end for c in spans.values())
    any_span = spans[last_rank]
    n = len(group_ranks(group))
    roots = {c.peer for c in spans.values()}
    size = matched_size(any_span.kind, {r: c.nbytes for r, c in spans.items()}, n,
                           roots.pop() if len(roots) == 1 else None)
    return Matched(group, seq, any_span.kind, any_span.step, dict(sorted(spans.items())),
                   last_rank, min(c.start for c in spans.values()), last, max(end, last),
                   size, n)


def _disagreement(group: str, seq: int, spans: dict[int, CommSpan],
                  readable: Mapping[int, RankLanes], ended: set[int]) -> Optional[Mismatch]:
    """The first way the members disagree at (group, seq), or None. ``readable``: rank ->
    RankLanes of the members whose traces could be read; ``ended``: members that stopped early
    (failed, interrupted, killed, truncated) before any collective of the group from ``seq``
    on: their absence is the stop's consequence, not a disagreement, whenever they stopped."""
    aspects: tuple[tuple[MismatchKind, Callable[[CommSpan], Any]], ...] = (
        (MismatchKind.KIND, lambda c: c.kind), (MismatchKind.DTYPE, lambda c: c.dtype),
        (MismatchKind.SIZE, lambda c: c.nbytes))
    for what, value in aspects:
        if what == MismatchKind.SIZE and any(c.kind in ("all_to_all", "barrier", "scatter")
                                  for c in spans.values()):
            continue      # all_to_all may split unevenly; a barrier carries nothing; a
            # scatter's root hands every chunk, its receivers none (bytes count what is handed)
        values: defaultdict[Any, list[int]] = defaultdict(list)
        for rank, c in sorted(spans.items()):
            values[value(c)].append(rank)
        if len(values) > 1:
            return Mismatch(group, seq, what, tuple(
                (v, tuple(ranks), tuple(spans[r].site for r in ranks))
                for v, ranks in sorted(values.items(), key=lambda kv: kv[1])))
    absent = [r for r in readable if r not in spans]
    if not absent:
        return None
    issued = tuple(sorted(spans))
    kind = spans[issued[0]].kind
    cut = tuple(r for r in absent if r in ended)
    missing = tuple(r for r in absent if r not in cut)
    side: Side = (kind, issued, tuple(spans[r].site for r in issued))
    if missing:
        return Mismatch(group, seq, MismatchKind.MISSING, (side, (None, missing, ())))
    return Mismatch(group, seq, MismatchKind.UNKNOWN, (side, (None, cut, ())))


def _commonest(items: Iterable[Optional[_H]]) -> Optional[_H]:
    """The most frequent item (None left out); among equally frequent ones, the first seen, so
    the choice does not follow the set order of string hashes, which differs between runs."""
    counts = Counter(i for i in items if i is not None)
    return counts.most_common(1)[0][0] if counts else None
