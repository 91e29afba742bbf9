"""Interval-set algebra on numpy arrays: the timeline's compute, communication and pass sets.

An interval set is an (n, 2) int64 array of disjoint ``[start, end)`` sorted by start. numpy keeps
these linear-time on traces of millions of events, where interval objects would not.
:class:`Prefix` answers "how much of this set lies inside [lo, hi)" in O(log n), so analyses that
ask it once per pass or per step stay O(n log n) overall.
"""
from __future__ import annotations

from typing import Any

import numpy as np

EMPTY = np.zeros((0, 2), dtype=np.int64)


def intervals(starts: Any, ends: Any) -> np.ndarray:
    """[start, end) pairs of the given array-likes, empty ones dropped."""
    iv = np.stack([np.asarray(starts, np.int64), np.asarray(ends, np.int64)], axis=1) \
        if len(starts) else EMPTY
    return iv[iv[:, 1] > iv[:, 0]]


def union(iv: np.ndarray) -> np.ndarray:
    """Merge overlapping or touching intervals."""
    if len(iv) == 0:
        return EMPTY
    iv = iv[np.argsort(iv[:, 0], kind="stable")]
    reach = np.maximum.accumulate(iv[:, 1])
    new = np.ones(len(iv), bool)
    new[1:] = iv[1:, 0] > reach[:-1]
    first = np.nonzero(new)[0]
    last = np.append(first[1:] - 1, len(iv) - 1)
    return np.stack([iv[first, 0], reach[last]], axis=1)


def intersect(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Intersection of two disjoint interval sets."""
    if len(a) == 0 or len(b) == 0:
        return EMPTY
    pos = np.concatenate([a[:, 0], a[:, 1], b[:, 0], b[:, 1]])
    delta = np.concatenate([np.ones(len(a)), -np.ones(len(a)), np.ones(len(b)),
                            -np.ones(len(b))]).astype(np.int64)
    order = np.lexsort((delta, pos))       # ends before starts at one position
    pos, depth = pos[order], np.cumsum(delta[order])
    both = np.nonzero(depth[:-1] == 2)[0]
    return intervals(pos[both], pos[both + 1])


def clip(iv: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """The parts of ``iv`` inside [lo, hi)."""
    return intervals(np.clip(iv[:, 0], lo, hi), np.clip(iv[:, 1], lo, hi)) if len(iv) else EMPTY


def window(iv: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """The parts of a disjoint, sorted ``iv`` inside [lo, hi), in O(log n + what it returns)."""
    if not len(iv):
        return EMPTY
    first = np.searchsorted(iv[:, 1], lo, side="right")
    stop = np.searchsorted(iv[:, 0], hi, side="left")
    return clip(iv[first:stop], lo, hi)


def gaps(iv: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """The parts of [lo, hi) that ``iv`` (disjoint) does not cover."""
    iv = clip(iv, lo, hi)
    return intervals(np.concatenate([[lo], iv[:, 1]]), np.concatenate([iv[:, 0], [hi]]))


def length(iv: np.ndarray) -> int:
    return int((iv[:, 1] - iv[:, 0]).sum()) if len(iv) else 0


class Prefix:
    """Covered length of a disjoint interval set inside any window, in O(log n) per query."""

    def __init__(self, iv: np.ndarray):
        self.starts = iv[:, 0].copy() if len(iv) else np.zeros(0, np.int64)
        self.ends = iv[:, 1].copy() if len(iv) else np.zeros(0, np.int64)
        self.before = np.concatenate([[0], np.cumsum(self.ends - self.starts)]).astype(np.int64)

    def upto(self, t: Any) -> np.ndarray:
        """Covered length in (-inf, t), for a scalar or an array of t."""
        t = np.asarray(t, dtype=np.int64)
        if not len(self.starts):
            return np.zeros_like(t)
        j = np.searchsorted(self.starts, t, side="right") - 1   # last interval starting <= t
        k = np.maximum(j, 0)
        partial = np.clip(np.minimum(self.ends[k], t) - self.starts[k], 0, None)
        return np.where(j >= 0, self.before[k] + partial, 0)

    def length(self, lo: Any, hi: Any) -> np.ndarray:
        """Covered length inside [lo, hi) (scalars or arrays)."""
        return np.maximum(self.upto(hi) - self.upto(lo), 0)
