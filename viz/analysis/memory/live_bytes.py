"""Memory of one rank, from its trace's memory rows (``tracer.trace(memory=True)``;
docs/trace-format.md, "Memory"): live bytes over time by category, the peak, and what was live
at the peak by category, module, phase and source site. Pure numpy, computed once per trace.

Rules (the recorder's are in tracer/recorder/memory/memory_recorder.py):

- a storage counts from its allocation row to its free row (never freed in the recording: to
  the end), with its bytes;
- a storage's category is its last one (its highest: a reclass only moves it later in
  MEMORY_CATEGORIES) for its whole life: it was made to be what it was found to be (a gradient
  is first an op's output in backward, an optimizer's state an output of its first step);
- events are applied in time order, ties in file order; live bytes after event ``i`` hold from
  ``times[i]`` to ``times[i + 1]`` (a step function);
- the peak is the first event after which the total is largest; what was live there is
  attributed through the op row each storage came out of (its module, phase and innermost user
  frame: for a backward op, the forward's); storages found alive by a walk (parameters made
  before the recording...) have no op: module, phase and site ``None``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, TypedDict, TypeVar

import numpy as np

from tracer.files.format import MEMORY_CATEGORIES, MEMORY_KINDS, MemoryCategory, MemoryKind
from tracer.files.reader import MemoryEvents, Trace
from tracer.vocab.labels import PHASES
from tracer.vocab.strenum import StrEnum

from ..callgraphs.op_groups import site_of

ALLOC, FREE, RECLASS = (MEMORY_KINDS.index(k) for k in MemoryKind)
_K = TypeVar("_K")


class Scope(StrEnum):
    """What a memory peak covers (PeakScope.scope)."""

    RECORDING = "recording"
    EXPORT = "export"


RECORDING, EXPORT = Scope.RECORDING, Scope.EXPORT


@dataclass(frozen=True)
class PeakScope:
    """What a rank's memory peak covers: ``recording``, paratrace's (storages made before it
    began found by a walk: parameters...), or ``export``, memory made within a torch.profiler
    export (what was allocated before the export began is not in its events).
    ``allocated_peak``: an export's own largest "Total Allocated" (torch's count of the
    device's allocated bytes, what came before the export included); None elsewhere."""

    scope: Scope
    allocated_peak: Optional[int] = None


def peak_scope(meta: dict[str, Any]) -> PeakScope:
    """The :class:`PeakScope` of a rank's trace from its metadata (tracer.kineto.convert
    writes ``imported.memory_allocated_peak``)."""
    imported = meta.get("imported")
    if not isinstance(imported, dict):
        return PeakScope(RECORDING)
    peak = imported.get("memory_allocated_peak")
    ok = type(peak) is int and peak >= 0
    return PeakScope(EXPORT, peak if ok else None)


class AtPeak(TypedDict):
    """What was live at a rank's memory peak, bytes by each name, largest first; ``site`` the
    top sites ("file:line function"). None: a storage of no op (found alive by a walk)."""

    category: dict[MemoryCategory, int]
    module: dict[Optional[str], int]
    phase: dict[Optional[str], int]
    site: list[tuple[Optional[str], int]]


# op rows -> {"module" | "phase" | "site": the name of each row}
RowLabels = Callable[[np.ndarray], dict[str, list[Optional[str]]]]


@dataclass(frozen=True)
class MemoryProfile:
    """One rank's memory (module doc). ``live[i, c]``: bytes of category ``categories[c]``
    live after event ``i`` (at ``times[i]``); ``at_peak``: what was live at the peak, as
    ``{"category" | "module" | "phase": {name: bytes}, "site": [(site, bytes), ...]}``, each
    largest first (``site`` the top ones, "file:line function")."""

    categories: tuple[MemoryCategory, ...]
    times: np.ndarray
    steps: np.ndarray
    live: np.ndarray
    total: np.ndarray
    peak_bytes: int
    peak_time: Optional[int]
    peak_step: Optional[int]
    category_peaks: dict[MemoryCategory, int]
    step_peaks: dict[int, int]
    at_peak: AtPeak
    storages: int

    def series(self, category: str) -> tuple[np.ndarray, np.ndarray]:
        """(times, live bytes) of one category, the step function's corners."""
        return self.times, self.live[:, self.categories.index(category)]


def peak_in(profile: MemoryProfile, steps: frozenset[int]
            ) -> tuple[int, dict[MemoryCategory, int]]:
    """(the most bytes live at once after an event of ``steps``, category -> bytes live then):
    a profile's peak over some steps only (trace-diff compares runs over the same steps)."""
    at = np.flatnonzero(np.isin(profile.steps, sorted(steps)))
    if not len(at):
        return 0, dict.fromkeys(profile.categories, 0)
    peak = int(at[np.argmax(profile.total[at])])
    return int(profile.total[peak]), {name: int(profile.live[peak, c])
                                      for c, name in enumerate(profile.categories)}


@dataclass(frozen=True)
class LiveMemory:
    """A rank's live bytes over time, to draw (the timeline's memory lane): at most
    MAX_CORNERS corners of the step function on rank 0's clock (and the first and the last),
    each the largest total of its stretch of events (so the peak is kept); ``live[i, c]``: bytes of
    ``categories[c]`` from ``times[i]`` to ``times[i + 1]``."""

    times: np.ndarray
    live: np.ndarray
    categories: tuple[MemoryCategory, ...]
    peak_bytes: int


MAX_CORNERS = 2_000


def live_memory(profile: Optional[MemoryProfile], to_rank0: Callable[[np.ndarray], Any]
                ) -> Optional[LiveMemory]:
    """The profile's live bytes to draw, its times moved to rank 0's clock by ``to_rank0``
    (local ns -> offsets to add: tracer.files.reader.Trace.clock_offset); None without."""
    if profile is None or not len(profile.times):
        return None
    n = len(profile.times)
    if n > MAX_CORNERS:             # each stretch of events: its largest total
        edges = np.linspace(0, n, MAX_CORNERS + 1).astype(np.int64)
        keep = np.unique([0, n - 1] + [a + int(np.argmax(profile.total[a:b]))
                                       for a, b in zip(edges[:-1], edges[1:]) if b > a])
    else:
        keep = np.arange(n)
    t = profile.times[keep]
    return LiveMemory(t + np.asarray(to_rank0(t), dtype=np.int64), profile.live[keep],
                      profile.categories, profile.peak_bytes)


def memory_profile(trace: Trace, top: int = 10) -> Optional[MemoryProfile]:
    """The memory profile of a loaded trace (tracer.files.reader.Trace), or None when its
    memory was not recorded."""
    events = trace.memory
    if events is None:
        return None
    return profile_events(events, _RowLabels(trace), top)


def profile_events(events: MemoryEvents, labels: Optional[RowLabels] = None, top: int = 10
                   ) -> MemoryProfile:
    """The profile of MemoryEvents (or anything with their arrays); ``labels(rows)`` gives
    the (module, phase, site) names of op rows, None without a trace."""
    kind, storage = np.asarray(events.kind), np.asarray(events.storage)
    nbytes, t = np.asarray(events.bytes), np.asarray(events.t)
    order = np.argsort(t, kind="stable")
    kind, storage, nbytes, t = kind[order], storage[order], nbytes[order], t[order]
    category, step = np.asarray(events.category)[order], np.asarray(events.step)[order]
    row = np.asarray(events.row)[order]
    size = int(storage.max()) + 1 if len(storage) else 0
    final = np.zeros(size, dtype=np.int64)
    classed = kind != FREE
    np.maximum.at(final, storage[classed], category[classed])
    alloc_at = np.full(size, -1, dtype=np.int64)
    allocs = np.flatnonzero(kind == ALLOC)
    alloc_at[storage[allocs[::-1]]] = allocs[::-1]          # each storage's first allocation
    counted = (kind == ALLOC) | ((kind == FREE) & (alloc_at[storage] >= 0))
    delta = np.where(kind == ALLOC, nbytes, -nbytes) * counted
    cats = final[storage]
    live = np.zeros((len(kind), len(MEMORY_CATEGORIES)), dtype=np.int64)
    for c in range(len(MEMORY_CATEGORIES)):
        live[:, c] = np.cumsum(np.where(cats == c, delta, 0))
    total = live.sum(axis=1)
    if not len(total):
        return MemoryProfile(MEMORY_CATEGORIES, t, step, live, total, 0, None, None,
                             dict.fromkeys(MEMORY_CATEGORIES, 0), {}, _empty_at_peak(), 0)
    peak = int(np.argmax(total))
    freed_at = np.full(size, len(kind), dtype=np.int64)
    frees = np.flatnonzero((kind == FREE) & counted)
    freed_at[storage[frees]] = frees
    alive = allocs[(allocs <= peak) & (freed_at[storage[allocs]] > peak)]
    module, phase, site = _attributed(row[alive], nbytes[alive], labels, top)
    at_peak: AtPeak = {"category": _by({MEMORY_CATEGORIES[c]: int(live[peak, c])
                                        for c in range(len(MEMORY_CATEGORIES))}),
                       "module": module, "phase": phase, "site": site}
    step_peaks = {int(s): int(total[step == s].max()) for s in np.unique(step) if s >= 0}
    return MemoryProfile(
        MEMORY_CATEGORIES, t, step, live, total, int(total[peak]), int(t[peak]),
        int(step[peak]) if step[peak] >= 0 else None,
        {name: int(live[:, c].max()) for c, name in enumerate(MEMORY_CATEGORIES)},
        step_peaks, at_peak, int(len(np.unique(storage[allocs]))))


def _by(values: dict[_K, int]) -> dict[_K, int]:
    return dict(sorted(values.items(), key=lambda kv: -kv[1]))


def _empty_at_peak() -> AtPeak:
    return {"category": dict.fromkeys(MEMORY_CATEGORIES, 0), "module": {}, "phase": {},
            "site": []}


def _attributed(rows: np.ndarray, nbytes: np.ndarray, labels: Optional[RowLabels], top: int
                ) -> tuple[dict[Optional[str], int], dict[Optional[str], int],
                           list[tuple[Optional[str], int]]]:
    """Bytes by module, by phase and by site (the top ones) of the op rows the live storages
    came out of."""
    names = labels(rows) if labels is not None else \
        {"module": [None] * len(rows), "phase": [None] * len(rows), "site": [None] * len(rows)}
    out: dict[str, dict[Optional[str], int]] = {}
    for key in ("module", "phase", "site"):
        sums: dict[Optional[str], int] = {}
        for name, b in zip(names[key], nbytes.tolist()):
            sums[name] = sums.get(name, 0) + b
        out[key] = _by(sums)
    return out["module"], out["phase"], list(out["site"].items())[:top]


class _RowLabels:
    """Module path, phase and innermost user site of op rows of a trace, each decoded once."""

    def __init__(self, trace: Trace) -> None:
        self._trace = trace
        self._sites: dict[tuple[int, int], Optional[str]] = {}

    def __call__(self, rows: np.ndarray) -> dict[str, list[Optional[str]]]:
        trace = self._trace
        modules, phases = trace.dictionary("module"), trace.col("phase")
        module, stack, fwd = trace.col("module"), trace.col("stack"), trace.col("fwd_stack")
        out: dict[str, list[Optional[str]]] = {"module": [], "phase": [], "site": []}
        for r in rows.tolist():
            if r < 0:
                out["module"].append(None)
                out["phase"].append(None)
                out["site"].append(None)
                continue
            out["module"].append(modules[module[r]] if module[r] >= 0 else None)
            out["phase"].append(PHASES[phases[r]] if 0 <= phases[r] < len(PHASES) else None)
            out["site"].append(self._site(int(stack[r]), int(fwd[r])))
        return out

    def _site(self, stack: int, fwd: int) -> Optional[str]:
        key = (stack, fwd)
        if key not in self._sites:
            frame = site_of(self._trace, stack, fwd) if stack >= 0 or fwd >= 0 else None
            self._sites[key] = None if frame is None else \
                f"{frame.file}:{frame.line} {frame.function}"
        return self._sites[key]
