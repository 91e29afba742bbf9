"""One rank's counted steps op by op, for trace-whatif's predictions on any model
(viz/whatif/recorded/setup.py and the modules it feeds): each compute op with its module, phase and
time; each collective with its kind, phase, group, bytes and module; the storages live in one
step with their category and the op that made them (a recording with memory); the parameters
each root module holds (the trace's ``parameters`` metadata,
tracer/recorder/attribution/parameters.py).

Read by :func:`step_detail_file`, one rank per task on the engine as the analysis's own passes
are (viz/analysis/map_reduce.py), after the analysis: it needs the counted steps. Times are on
rank 0's clock, as the timeline's. Pure numpy over one trace.
"""
from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np

from tracer.files.format import MEMORY_CATEGORIES, MemoryCategory
from tracer.files.reader import MemoryEvents, Trace, load as load_trace
from tracer.vocab.groups import group_ranks
from tracer.vocab.labels import PHASES, Phase

from .memory.live_bytes import ALLOC, FREE
from .rank import check_identity
from .timeline.rank_rows import RankRows

# an op row's (module, phase, op name); Nones for no row (a storage found by a walk)
RowLabel = tuple[Optional[str], Optional[str], Optional[str]]


@dataclass
class StepOps:
    """Compute ops of the counted steps, in time order (numpy columns; codes into the lists)."""

    step: np.ndarray
    t0: np.ndarray
    t1: np.ndarray
    module: np.ndarray               # into ``modules``; -1: outside every module
    phase: np.ndarray                # into tracer.vocab.labels.PHASES
    op: np.ndarray                   # into ``names``
    shapes: np.ndarray               # into ``shape_texts``; -1: none recorded
    modules: list[str]
    names: list[str]
    shape_texts: list[str]

    def __len__(self) -> int:
        return len(self.t0)


@dataclass(frozen=True)
class StepComm:
    """A collective or P2P operation of a counted step, as the trace has it."""

    step: int
    t0: int
    kind: str
    phase: Phase
    group: tuple[int, ...]
    group_text: str
    nbytes: int
    module: Optional[str]


@dataclass(frozen=True)
class Storage:
    """A storage live in the memory step: ``start`` None when it was made before the step,
    ``end`` None when it outlived it; made by an op of ``module`` in ``phase`` (None: found by
    a walk)."""

    category: MemoryCategory
    nbytes: int
    start: Optional[int]
    end: Optional[int]
    module: Optional[str]
    phase: Optional[str]
    op: Optional[str]


@dataclass
class RankStepDetail:
    rank: int
    steps: tuple[int, ...]           # the counted steps
    ops: StepOps
    comms: list[StepComm]            # in launch order
    parameters: dict[str, Any]       # root path -> {"parameters": [...], "buffers": [...]}
    memory_step: Optional[int] = None
    window: Optional[tuple[int, int]] = None   # (start, end) of the memory step, rank 0's clock
    storages: list[Storage] = field(default_factory=list)


def step_detail_file(path: str, rank: int, steps: Collection[int],
                     memory_step: Optional[int]) -> RankStepDetail:
    """The detail of ``steps`` of one rank's trace, and its storages in ``memory_step``."""
    trace = load_trace(path)
    check_identity(trace, path, rank)
    rows = RankRows(trace, rank)
    in_steps = np.isin(rows.step, list(steps))
    compute = np.nonzero(rows.is_compute & in_steps)[0]
    compute = compute[np.argsort(rows.t0[compute], kind="stable")]
    ops = StepOps(rows.step[compute], rows.t0[compute], rows.t1[compute],
                  trace.col("module")[compute], trace.col("phase")[compute], rows.op[compute],
                  trace.col("shapes")[compute], list(trace.dictionary("module")),
                  list(rows.op_names), list(trace.dictionary("shapes")))
    out = RankStepDetail(rank, tuple(steps), ops, _comms(trace, rows, in_steps),
                         dict(trace.meta.get("parameters") or {}))
    if memory_step is not None and trace.memory is not None:
        out.memory_step = memory_step
        out.window, out.storages = _storages(trace, trace.memory, memory_step)
    return out


def _comms(trace: Trace, rows: RankRows, in_steps: np.ndarray) -> list[StepComm]:
    picked = np.nonzero(rows.is_comm & in_steps)[0]
    picked = picked[np.argsort(rows.t0[picked], kind="stable")]
    modules, phase = trace.dictionary("module"), trace.col("phase")
    module, nbytes = trace.col("module"), trace.col("bytes")
    out = []
    for i in picked.tolist():
        text = rows.group_of(i)
        out.append(StepComm(int(rows.step[i]), int(rows.t0[i]), rows.kinds[rows.kind[i]],
                            PHASES[phase[i]], tuple(group_ranks(text)) if text else (),
                            text, max(int(nbytes[i]), 0),
                            modules[module[i]] if module[i] >= 0 else None))
    return out


def _storages(trace: Trace, events: MemoryEvents, step: int
              ) -> tuple[Optional[tuple[int, int]], list[Storage]]:
    """((start, end) of ``step``, the storages live in it) on rank 0's clock; ``events``: the
    trace's memory."""
    t = events.t + trace.clock_offset(events.t)
    order = np.argsort(t, kind="stable")
    kind, storage, nbytes = events.kind[order], events.storage[order], events.bytes[order]
    category, steps, row, t = events.category[order], events.step[order], events.row[order], \
        t[order]
    final: dict[int, int] = {}       # storage -> its last category
    for k, s, c in zip(kind.tolist(), storage.tolist(), category.tolist()):
        if k != FREE:
            final[s] = max(final.get(s, 0), c)
    mine = np.nonzero(steps == step)[0]
    if not len(mine):
        return None, []
    lo, hi = int(t[mine[0]]), int(t[mine[-1]])
    labels = _labels(trace)
    born: dict[int, tuple[Optional[int], int, int]] = {}   # storage -> (start or None, bytes, row)
    out = []
    for i in range(len(kind)):
        k, s, when = int(kind[i]), int(storage[i]), int(t[i])
        if when > hi:
            break
        if k == ALLOC:
            born[s] = (when if when >= lo else None, int(nbytes[i]), int(row[i]))
        elif k == FREE and s in born:
            start, size, made = born.pop(s)
            if when >= lo:
                out.append(_storage(final[s], size, start, when, made, labels))
    for s, (start, size, made) in born.items():
        out.append(_storage(final[s], size, start, None, made, labels))
    return (lo, hi), out


def _labels(trace: Trace) -> Callable[[int], RowLabel]:
    modules, phase, op = trace.dictionary("module"), trace.col("phase"), trace.col("op")
    module, names = trace.col("module"), trace.dictionary("op")

    def label(row: int) -> RowLabel:
        if row < 0:
            return None, None, None
        return (modules[module[row]] if module[row] >= 0 else None, PHASES[phase[row]],
                names[op[row]])
    return label


def _storage(category: int, size: int, start: Optional[int], end: Optional[int], row: int,
             labels: Callable[[int], RowLabel]) -> Storage:
    module, phase, op = labels(row)
    return Storage(MEMORY_CATEGORIES[category], size, start, end, module, phase, op)
