"""An export's allocator events (``[memory]``, torch.profiler's ``profile_memory=True``) as the
trace's memory rows (docs/trace-format.md, "Memory"), so an imported run gets the same memory
analyses as a recorded one.

- One device's events: CUDA's where the export has any (the memory a GPU run is short of),
  else the CPU's.
- Each allocation (``Bytes`` > 0 at ``Addr``) is a storage of its own until the free at the
  same address (``Bytes`` < 0); a free of an address allocated before the export began is
  written too, and readers leave it out (it has no allocation).
- An allocation keeps the allocator's time; made inside an op (a host op of its thread whose
  interval holds it) it carries that thread, and the reader links it to the innermost such
  op's row. One made outside every op has no thread.
- Its category, from the phases of the ops around it (an export has addresses and sizes, not
  which tensor a block holds, so these are derived from when a block lives):

  - ``comm``: made inside a collective;
  - ``optimizer_state``: made inside an optimizer op and still alive when the next op of
    another phase starts (AdamW's ``exp_avg``; the optimizer's own scratch is freed before),
    or, with no such op after it, never freed in the export;
  - ``gradients``: made inside a backward (or gradient-sync) op and still alive when the next
    optimizer op starts, or, with none after it, never freed in the export;
  - ``activations``: made inside a forward (or recompute) op and freed while the backward runs
    (the op started last before the free is a backward op): what autograd saved, and the loss;
  - ``temporaries``: the rest.

  Parameters are never seen (made before any profile starts), nor is optimizer state the first
  step made before the export's steps. The front page says so.

The peak of these rows is memory made within the export. torch's own count, the allocator's
"Total Allocated" after each event, holds what was allocated before the export began too (on
CUDA, the caching allocator's; on the CPU, what the profiler's reporter saw allocated while
memory was profiled in this process); its largest value is kept beside
(:func:`allocated_peak`, the trace's ``imported.memory_allocated_peak``).
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from tracer.files.format import MEMORY_CATEGORIES, MEMORY_KINDS, MemoryCategory, MemoryKind
from tracer.files.reader import latest_holding
from tracer.vocab.labels import (PHASE_BACKWARD, PHASE_FORWARD, PHASE_GRAD_SYNC,
                                 PHASE_OPTIMIZER, PHASE_RECOMPUTE)

CUDA = 1                                   # the profiler's Device Type of a CUDA allocation
ALLOC, FREE = MEMORY_KINDS.index(MemoryKind.ALLOC), MEMORY_KINDS.index(MemoryKind.FREE)
TEMPORARIES, COMM, ACTIVATIONS, OPTIMIZER_STATE, GRADIENTS = (
    MEMORY_CATEGORIES.index(c) for c in (MemoryCategory.TEMPORARIES, MemoryCategory.COMM,
                                         MemoryCategory.ACTIVATIONS,
                                         MemoryCategory.OPTIMIZER_STATE,
                                         MemoryCategory.GRADIENTS))
NEVER = np.iinfo(np.int64).max             # the time of a free the export does not hold


def memory_device(mem: dict[str, np.ndarray]) -> Optional[str]:
    """Which device's allocations an import keeps ("cuda" or "cpu"), None without any."""
    if not len(mem.get("t", ())):
        return None
    return "cuda" if (mem["device_type"] == CUDA).any() else "cpu"


def allocated_peak(mem: dict[str, np.ndarray]) -> Optional[int]:
    """The largest "Total Allocated" among the events of the device an import keeps (torch's
    own count of the device's allocated bytes, before the export included); None where the
    export says none."""
    device = memory_device(mem)
    if device is None or "total" not in mem:
        return None
    keep = (mem["device_type"] == CUDA) if device == "cuda" else (mem["device_type"] != CUDA)
    totals = mem["total"][keep]
    totals = totals[totals >= 0]
    return int(totals.max()) if len(totals) else None


def memory_columns(mem: dict[str, np.ndarray], base: int, rows: dict[str, np.ndarray],
                   thread_of_tid: dict[int, int]) -> Optional[dict[str, np.ndarray]]:
    """The memory rows of an export's allocator events (``mem``: events.collect's columns,
    times relative; ``base`` makes them Unix ns) beside its op rows (``rows``: the trace's
    columns, t0/t1/thread/kind/step/phase, ordered by t0; ``thread_of_tid``: Kineto tid -> the
    trace's thread number): columns for TraceWriter.write_columns, or None without events."""
    device = memory_device(mem)
    if device is None:
        return None
    keep = (mem["device_type"] == CUDA) if device == "cuda" else (mem["device_type"] != CUDA)
    order = np.argsort(mem["t"][keep], kind="stable")
    t = mem["t"][keep][order] + base
    addr = mem["addr"][keep][order]
    nbytes = mem["bytes"][keep][order]
    tid = mem["tid"][keep][order]
    n = len(t)
    kind = np.where(nbytes > 0, ALLOC, FREE)
    storage = np.zeros(n, dtype=np.int64)
    live: dict[int, int] = {}          # address -> its allocation's storage id
    next_id = 0
    for i, (a, b) in enumerate(zip(addr.tolist(), nbytes.tolist())):
        if b > 0:
            storage[i] = live[a] = next_id
            next_id += 1
        else:
            sid = live.pop(a, None)
            if sid is None:             # allocated before the export: an id nobody allocated
                sid, next_id = next_id, next_id + 1
            storage[i] = sid
    op_row = _enclosing_ops(t, tid, rows, thread_of_tid)
    inside = (kind == ALLOC) & (op_row >= 0)
    at = np.maximum(op_row, 0)
    thread = np.where(inside, rows["thread"][at], -1)
    category = _categories(kind, storage, t, np.where(inside, op_row, -1), rows)
    step = _steps_at(t, rows)
    return {"mem_kind": kind, "mem_storage": storage, "mem_category": category,
            "bytes": np.abs(nbytes), "t0": t, "thread": thread, "step": step}


def _enclosing_ops(t: np.ndarray, tid: np.ndarray, rows: dict[str, np.ndarray],
                   thread_of_tid: dict[int, int]) -> np.ndarray:
    """Per event, the op row (innermost: the latest started) of its thread whose [t0, t1]
    holds it, else -1."""
    out = np.full(len(t), -1, dtype=np.int64)
    t0, t1, thread = rows["t0"], rows["t1"], rows["thread"]
    for k in np.unique(tid).tolist():
        code = thread_of_tid.get(k)
        if code is None:
            continue
        mine = np.nonzero((thread == code) & (t1 >= t0))[0]       # t0-ordered already
        events = np.nonzero(tid == k)[0]
        held = latest_holding(t0[mine], t1[mine], t[events])
        out[events] = np.where(held >= 0, mine[np.maximum(held, 0)], -1)
    return out


def _categories(kind: np.ndarray, storage: np.ndarray, t: np.ndarray, made_in: np.ndarray,
                rows: dict[str, np.ndarray]) -> np.ndarray:
    """Each event's category (module doc), one per storage: ``made_in``: the op row that holds
    an allocation, -1 for the rest."""
    allocs = np.nonzero((kind == ALLOC) & (made_in >= 0))[0]
    if not len(allocs) or not len(rows["t0"]):
        return np.full(len(t), TEMPORARIES, dtype=np.int64)
    phase, starts = rows["phase"], rows["t0"]
    freed_at = np.full(int(storage.max()) + 1, NEVER, dtype=np.int64)
    frees = np.nonzero(kind == FREE)[0]
    freed_at[storage[frees]] = t[frees]
    made, end = phase[made_in[allocs]], freed_at[storage[allocs]]
    comm = rows["kind"][made_in[allocs]] >= 0
    optimizer = np.nonzero(phase == PHASE_OPTIMIZER)[0]
    other = np.nonzero(phase != PHASE_OPTIMIZER)[0]
    cats = np.full(len(allocs), TEMPORARIES, dtype=np.int64)
    cats[(made == PHASE_OPTIMIZER) & _outlives(end, _next_start(starts[other], t[allocs]))] = \
        OPTIMIZER_STATE
    backward = (made == PHASE_BACKWARD) | (made == PHASE_GRAD_SYNC)
    cats[backward & _outlives(end, _next_start(starts[optimizer], t[allocs]))] = GRADIENTS
    last = np.searchsorted(starts, np.minimum(end, t[-1] + 1), side="right") - 1
    freed_in = np.where((last >= 0) & (end < NEVER), phase[np.maximum(last, 0)], -1)
    forward = (made == PHASE_FORWARD) | (made == PHASE_RECOMPUTE)
    cats[forward & (freed_in == PHASE_BACKWARD)] = ACTIVATIONS
    cats[comm] = COMM
    by_storage = np.full(len(freed_at), TEMPORARIES, dtype=np.int64)
    by_storage[storage[allocs]] = cats       # a storage's free takes its allocation's
    return by_storage[storage]


def _outlives(end: np.ndarray, start: np.ndarray) -> np.ndarray:
    """Freed after ``start``; where no such op comes (an export that ends with the optimizer
    step, or with the backward), never freed in the export."""
    return (end > start) | ((start == NEVER) & (end == NEVER))


def _next_start(starts: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Per time, the first of the sorted ``starts`` after it (NEVER where none)."""
    return np.append(starts, NEVER)[np.searchsorted(starts, t, side="right")]


def _steps_at(t: np.ndarray, rows: dict[str, np.ndarray]) -> np.ndarray:
    """The step of the op row started last at or before each time (0 before any)."""
    if not len(rows["t0"]):
        return np.zeros(len(t), dtype=np.int64)
    j = np.searchsorted(rows["t0"], t, side="right") - 1
    return np.where(j >= 0, rows["step"][np.maximum(j, 0)], 0)
