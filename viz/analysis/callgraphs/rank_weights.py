"""Per-rank weights of a built call graph, stored as columns.

A merged call graph of many ranks holds, on every node and edge, what each rank put there
(``per_rank``: rank -> :class:`viz.analysis.callgraphs.op_groups.Weights`, for the tooltips' top
ranks, the nodes only some ranks reach, the notes of what pruning hid). As dicts of objects that is
about 200 bytes a node, edge and rank (a 64-rank run: tens of MiB a graph); once a graph is built
they never change, so :func:`freeze_per_rank` moves them into one table of numpy columns per graph
(44 bytes an entry) and leaves each node and edge a read-only :class:`RankWeights` view of its rows,
in the order the ranks were first added, with its total summed once the way
:func:`viz.analysis.callgraphs.op_groups.total_of` sums it (the same floating-point order, so every
number drawn is the same as from the dicts).
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Protocol

import numpy as np

from .op_groups import Weights, total_of


class RankTable:
    """Every (node or edge, rank) entry of one graph: ``rank`` and, per entry, ``counts``
    (ops, bytes, comms, flops) and ``time_ns``."""

    __slots__ = ("rank", "counts", "time_ns")

    def __init__(self, rank: np.ndarray, counts: np.ndarray, time_ns: np.ndarray):
        self.rank, self.counts, self.time_ns = rank, counts, time_ns

    def weights(self, i: int) -> Weights:
        ops, nbytes, comms, flops = self.counts[i].tolist()
        return Weights(ops, float(self.time_ns[i]), nbytes, comms, flops)

    def rows(self, start: int, stop: int) -> list[tuple[int, Weights]]:
        """(rank, Weights) of rows ``start:stop``, read from the columns at once."""
        return [(rank, Weights(ops, time_ns, nbytes, comms, flops))
                for rank, (ops, nbytes, comms, flops), time_ns in zip(
                    self.rank[start:stop].tolist(), self.counts[start:stop].tolist(),
                    self.time_ns[start:stop].tolist())]


class RankWeights(Mapping[int, Weights]):
    """rank -> Weights of one node or edge: rows ``start:stop`` of a :class:`RankTable`.
    Read-only; each lookup builds a new Weights. ``items()`` and ``values()`` are lists, read
    from the columns at once."""

    __slots__ = ("_table", "_start", "_stop", "_total")

    def __init__(self, table: RankTable, start: int, stop: int, total: Weights):
        self._table, self._start, self._stop, self._total = table, start, stop, total

    def _ranks(self) -> list[int]:
        return self._table.rank[self._start:self._stop].tolist()

    def __getitem__(self, rank: int) -> Weights:
        hit = np.flatnonzero(self._table.rank[self._start:self._stop] == rank)
        if not len(hit):
            raise KeyError(rank)
        return self._table.weights(self._start + int(hit[0]))

    def __iter__(self) -> Iterator[int]:
        return iter(self._ranks())

    def __len__(self) -> int:
        return self._stop - self._start

    def items(self) -> list[tuple[int, Weights]]:  # type: ignore[override]
        return self._table.rows(self._start, self._stop)

    def values(self) -> list[Weights]:  # type: ignore[override]
        return [w for _, w in self._table.rows(self._start, self._stop)]

    def total(self) -> Weights:
        """The sum over ranks (a new Weights, as :func:`viz.analysis.callgraphs.op_groups.total_of`
        gives)."""
        return total_of((self._total,))


class HasRankWeights(Protocol):
    """A call graph's node or edge data (viz.analysis.callgraphs.callgraph)."""

    per_rank: Mapping[int, Weights]


def freeze_per_rank(owners: Sequence[HasRankWeights]) -> None:
    """Replace the ``per_rank`` of each node or edge data in ``owners`` (a dict, or a
    :class:`RankWeights` of another table) by a :class:`RankWeights` over one new table.
    Counts beyond int64 keep their dicts."""
    ranks: list[int] = []
    counts: list[tuple[int, int, int, int]] = []
    times: list[float] = []
    bounds: list[tuple[int, int]] = []
    for owner in owners:
        start = len(ranks)
        for rank, w in owner.per_rank.items():
            ranks.append(rank)
            counts.append((w.ops, w.bytes, w.comms, w.flops))
            times.append(w.time_ns)
        bounds.append((start, len(ranks)))
    try:
        table = RankTable(np.array(ranks, dtype=np.int32),
                          np.array(counts, dtype=np.int64).reshape(-1, 4),
                          np.array(times, dtype=np.float64))
    except OverflowError:
        return
    for owner, (start, stop) in zip(owners, bounds):
        owner.per_rank = RankWeights(table, start, stop, total_over_ranks(owner.per_rank))


def total_over_ranks(per_rank: Mapping[int, Weights]) -> Weights:
    """The sum of a ``per_rank`` mapping, dict or :class:`RankWeights`."""
    if isinstance(per_rank, RankWeights):
        return per_rank.total()
    return total_of(per_rank.values())
