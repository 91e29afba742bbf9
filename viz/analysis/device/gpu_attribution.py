"""Device time: each GPU activity placed on the host clock and attributed to the event that
launched it.

On a GPU the host only launches: an aten op's host interval says when it was queued, not when
it ran. CUPTI's records (:mod:`tracer.kineto.chrome_trace`) say when each kernel, memcpy and memset
ran, and which runtime or driver call launched it (the correlation id). Attribution:

1. CUPTI times are Unix nanoseconds; the trace's clock pairs (``clock_pairs``, or its start
   time for traces written before them) map them onto the rank's own clock.
2. A launch belongs to the recorded event (aten op, collective, ``init_process_group``) whose
   host interval holds it, on the launching thread when the trace says which host thread is
   which (``threads``), else on any.
3. Launches inside process-group setup of a trace that recorded no event for it (the window
   from the trace's start to its first clock alignment) go to ``c10d.init_process_group``.
4. A launch inside no event but inside an annotation range (a ``torch.compile`` region whose
   fused kernels are no aten op, a higher-order operator, a CUDA graph replayed or a Triton
   kernel called directly under ``tracer.annotate`` or ``record_function``) goes to the
   innermost such range, and is counted apart: the range's row, shown by kernel name
   (:func:`viz.analysis.callgraphs.op_groups.kernel_groups`).
5. A launch between two events on its thread (host work no aten op covers: ``torch.tensor``'s
   host-to-device copy, NCCL's copies after a collective returned) goes to the nearer of the
   two, and is counted apart.

The launching thread's own events and ranges come first, then any thread's. Each activity
follows its launch. The result, :class:`DeviceTime`, gives every row of the trace
its device time (call-graph weights, module and op times), the activities on the rank's clock
(lanes per stream, compute and communication on the device) and the summary counts.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np

from tracer.files.device_format import DeviceRecords, KINDS
from tracer.files.reader import Trace
from tracer.vocab import ops as _ops

from ..timeline.intervals import intersect, intervals, length, union

SETUP = -2                    # attributed to process-group setup (no row records it)
UNATTRIBUTED = -1
INSIDE, IN_SETUP, BETWEEN, IN_REGION = 0, 1, 2, 3   # how a launch was attributed (-1: not)
SETUP_OP = "c10d.init_process_group"
KERNEL, MEMCPY, MEMSET = (KINDS.index(k) for k in ("kernel", "memcpy", "memset"))


@dataclass
class DeviceTime:
    """One rank's GPU activity, attributed. Times are on the rank's own host clock (ns)."""

    start: np.ndarray             # activity start / end
    end: np.ndarray
    stream: np.ndarray
    device: np.ndarray
    kind: np.ndarray              # codes of tracer.files.device_format.KINDS
    name: np.ndarray              # codes into names
    names: list[str]
    row: np.ndarray               # trace row of the launching event or range, SETUP or
    #                               UNATTRIBUTED
    how: np.ndarray               # INSIDE, IN_SETUP, BETWEEN, IN_REGION; -1 none
    launch: np.ndarray            # when its launch call started (-1: no launch record)
    row_ns: np.ndarray            # per trace row: device time of the activities it launched

    def __len__(self) -> int:
        return len(self.start)

    def in_regions(self) -> "RegionWork":
        """The activities launched inside an annotation range and none of its events."""
        mine = self.how == IN_REGION
        return RegionWork(self.row[mine], self.name[mine], self.names,
                          (self.end - self.start)[mine])

    @property
    def is_nccl(self) -> np.ndarray:
        """NCCL kernels: kernels whose name says nccl, in any case (``ncclDevKernel_*``,
        ``ncclKernel_*``, ``void ncclKernel...``)."""
        return (self.kind == KERNEL) & nccl_names(self.names)[self.name]

    @property
    def is_memory(self) -> np.ndarray:
        """Memcpys and memsets: memory activity, never compute."""
        return (self.kind == MEMCPY) | (self.kind == MEMSET)

    def summary(self, op_names: list[str], op_codes: np.ndarray) -> "DeviceSummary":
        """The rank's GPU activity in numbers: how much was attributed and how, its busy time,
        device time per op, and :func:`whole`."""
        attributed = self.row != UNATTRIBUTED
        by_op: dict[str, float] = {}
        dur = (self.end - self.start).astype(np.float64)
        region = self.how == IN_REGION
        on_op = (self.row >= 0) & ~region
        if on_op.any():
            per_code = np.bincount(op_codes[self.row[on_op]], weights=dur[on_op],
                                   minlength=len(op_names))
            by_op = {op_names[i]: s / 1e9 for i, s in enumerate(per_code.tolist()) if s > 0}
        if region.any():        # a range's own GPU work goes by kernel name, not by the range
            per_name = np.bincount(self.name[region], weights=dur[region],
                                   minlength=len(self.names))
            for i, s in enumerate(per_name.tolist()):
                if s > 0:
                    by_op[self.names[i]] = by_op.get(self.names[i], 0.0) + s / 1e9
        setup = float(dur[self.row == SETUP].sum())
        if setup > 0:
            by_op[SETUP_OP] = by_op.get(SETUP_OP, 0.0) + setup / 1e9
        all_of_it = whole(self.kind, self.is_nccl, self.start, self.end)
        return DeviceSummary(
            activities=int(len(self)), attributed=int(attributed.sum()),
            inside_an_event=int((self.how == INSIDE).sum()),
            inside_a_region=int(region.sum()),
            process_group_setup=int((self.how == IN_SETUP).sum()),
            between_events=int((self.how == BETWEEN).sum()),
            busy_s=all_of_it.busy_s,
            by_op=dict(sorted(by_op.items(), key=lambda kv: -kv[1])), whole=all_of_it)


@dataclass(frozen=True)
class RegionWork:
    """GPU activities launched inside annotation ranges, outside their events: per activity
    the range's trace row, its name (a code into ``names``) and its device time (ns)."""

    row: np.ndarray
    name: np.ndarray
    names: list[str]
    ns: np.ndarray


@dataclass(frozen=True)
class DeviceWhole:
    """Every activity of a recording or export, counted and measured (docs/architecture.md's
    ``device.whole``; seconds)."""

    kernels: int
    memcpys: int
    memsets: int
    comm_kernels: int             # NCCL kernels
    span_s: float                 # last end - first start
    busy_s: float                 # union of every activity
    compute_s: float              # union of the kernels that are not NCCL
    comm_s: float                 # union of NCCL kernels
    memory_s: float               # union of memcpys and memsets
    idle_s: float                 # span - busy
    overlap_fraction: Optional[float]   # |comm ∩ compute| / |comm|; None without comm


@dataclass(frozen=True)
class DeviceSummary:
    """One rank's GPU activity in numbers (:meth:`DeviceTime.summary`)."""

    activities: int
    attributed: int
    inside_an_event: int          # launched inside an event's host interval
    inside_a_region: int          # inside an annotation range, outside its events
    process_group_setup: int      # launched in process-group setup no event records
    between_events: int           # launched between two events: the nearer one
    busy_s: float
    by_op: dict[str, float]       # op -> device seconds, most first
    whole: DeviceWhole


def nccl_names(names: list[str]) -> np.ndarray:
    """Per name (and one more, False, for code -1): whether it names an NCCL kernel."""
    return np.array(["nccl" in n.lower() for n in names] + [False], dtype=bool)


def whole(kind: np.ndarray, nccl: np.ndarray, start: np.ndarray, end: np.ndarray
          ) -> DeviceWhole:
    """Every activity of the recording or export, counted and measured (docs/architecture.md): busy
    = union of all activities; compute = union of the kernels that are not NCCL; comm = union of
    NCCL kernels; memory = union of memcpys and memsets; span = last end - first start; idle =
    span - busy; overlap = |comm ∩ compute| / |comm|, None without comm."""
    kernel = kind == KERNEL
    memory = (kind == MEMCPY) | (kind == MEMSET)
    compute_iv = union(intervals(start[kernel & ~nccl], end[kernel & ~nccl]))
    comm_iv = union(intervals(start[nccl], end[nccl]))
    busy = length(union(intervals(start, end)))
    span = int(end.max() - start.min()) if len(start) else 0
    comm = length(comm_iv)
    return DeviceWhole(
        kernels=int(kernel.sum()), memcpys=int((kind == MEMCPY).sum()),
        memsets=int((kind == MEMSET).sum()), comm_kernels=int(nccl.sum()),
        span_s=span / 1e9, busy_s=busy / 1e9, compute_s=length(compute_iv) / 1e9,
        comm_s=comm / 1e9, memory_s=length(union(intervals(start[memory], end[memory]))) / 1e9,
        idle_s=(span - busy) / 1e9,
        overlap_fraction=length(intersect(comm_iv, compute_iv)) / comm if comm else None)


def to_local(trace: Trace, unix_ns: np.ndarray) -> np.ndarray:
    """Unix ns -> the rank's own clock, through its clock pairs: the offset between the two
    clocks drifts linearly from the first pair to the last (one pair: a constant offset)."""
    pairs = trace.meta.get("clock_pairs") or []
    if not pairs and trace.meta.get("start_unix") is not None:
        pairs = [{"perf_ns": int(trace.meta["start_ns"]),
                  "unix_ns": int(round(float(trace.meta["start_unix"]) * 1e9))}]
    if not pairs:
        raise ValueError(f"{trace.path}: no clock pairs: device times cannot be placed")
    u = np.asarray(unix_ns, dtype=np.int64)
    first, last = pairs[0], pairs[-1]
    off0 = first["unix_ns"] - first["perf_ns"]
    off1 = last["unix_ns"] - last["perf_ns"]
    span = last["unix_ns"] - first["unix_ns"]
    if span <= 0:
        return u - off0
    drift = (off1 - off0) * ((u - first["unix_ns"]).astype(np.float64) / span)
    return u - off0 - np.round(drift).astype(np.int64)


def attribute(trace: Trace, records: DeviceRecords) -> Optional[DeviceTime]:
    """Attribute ``records`` (one rank's) to the rows of ``trace``; None without activity."""
    activity = ~records.is_launch
    if not activity.any():
        return None
    launches = records.is_launch
    local_launch = to_local(trace, records.start[launches])
    launch_row, launch_how = _launch_rows(trace, local_launch, records.tid[launches])
    by_corr = dict(zip(records.corr[launches].tolist(), zip(
        launch_row.tolist(), launch_how.tolist(), local_launch.tolist())))
    found = [by_corr.get(c, (UNATTRIBUTED, -1, -1)) for c in records.corr[activity].tolist()]
    row = np.array([f[0] for f in found], dtype=np.int64)
    how = np.array([f[1] for f in found], dtype=np.int64)
    launch = np.array([f[2] for f in found], dtype=np.int64)
    start = to_local(trace, records.start[activity])
    end = to_local(trace, records.end[activity])
    row_ns = np.zeros(len(trace), dtype=np.int64)
    real = row >= 0
    np.add.at(row_ns, row[real], (end - start)[real])
    return DeviceTime(start, end, records.stream[activity], records.device[activity],
                      records.kind[activity], records.name[activity], records.names, row, how,
                      launch, row_ns)


def _launch_rows(trace: Trace, t: np.ndarray, tid: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray]:
    """(row, how) of each launch time (rank clock) and Kineto thread id."""
    op = trace.col("op")
    pseudo = [trace.code("op", n) for n in _ops.PSEUDO_OPS if n != _ops.OP_PG_INIT]
    events = np.nonzero(~np.isin(op, pseudo))[0]
    t0, t1, t_ret = trace.col("t0"), trace.col("t1"), trace.col("t_ret")
    # a collective launches during its call (t0 to its return), not until its completion
    end = np.where(t_ret >= 0, t_ret, np.where(t1 >= 0, t1, t0))
    ranges = np.nonzero((op == trace.code("op", _ops.OP_ANNOTATION)) & (t1 >= t0))[0]
    thread = trace.col("thread")
    idents = {int(k): int(v) & 0xFFFFFFFF for k, v in (trace.meta.get("threads") or {}).items()}
    row = np.full(len(t), UNATTRIBUTED, dtype=np.int64)
    how = np.full(len(t), -1, dtype=np.int64)
    for k, ident in idents.items():     # the launching thread's events, then its ranges
        mine = tid == ident
        _innermost(events[thread[events] == k], t0, end, t, mine, row, how, INSIDE)
        _innermost(ranges[thread[ranges] == k], t0, t1, t, mine, row, how, IN_REGION)
    anyone = np.ones(len(t), bool)       # then any thread's
    _innermost(events, t0, end, t, anyone, row, how, INSIDE)
    _setup(trace, t, row, how)
    _innermost(ranges, t0, t1, t, anyone, row, how, IN_REGION)
    _between(events, t0, end, t, row, how)
    return row, how


def _innermost(rows: np.ndarray, t0: np.ndarray, end: np.ndarray, t: np.ndarray,
               which: np.ndarray, row: np.ndarray, how: np.ndarray, code: int) -> None:
    """Each launch of ``which`` not yet attributed, held by one of ``rows`` (its t0 to its
    ``end``, ends included), goes to the innermost: the latest-started whose end is past it."""
    todo = which & (row == UNATTRIBUTED)
    if not todo.any() or not len(rows):
        return
    rows = rows[np.argsort(t0[rows], kind="stable")]
    starts, ends = t0[rows], np.maximum.accumulate(end[rows])
    when = t[todo]
    j = np.searchsorted(starts, when, side="right") - 1
    inside = (j >= 0) & (ends[np.maximum(j, 0)] >= when)
    k = np.where(inside, j, -1)
    own_end = end[rows]
    late = inside & (own_end[np.maximum(k, 0)] < when)     # only these need a walk back
    for n in np.nonzero(late)[0].tolist():
        while k[n] >= 0 and own_end[k[n]] < when[n]:
            k[n] -= 1
    found = k >= 0
    idx = np.nonzero(todo)[0][found]
    row[idx] = rows[k[found]]
    how[idx] = code


def _setup(trace: Trace, t: np.ndarray, row: np.ndarray, how: np.ndarray) -> None:
    """Launches in process-group setup, for traces that recorded no event for it: from the
    trace's start to its first clock alignment (taken as init_process_group returns)."""
    start, aligned = trace.meta.get("start_ns"), (trace.meta.get("clock_start") or {}).get("at_ns")
    if start is None or aligned is None or trace.code("op", _ops.OP_PG_INIT) >= 0:
        return
    mask = (row == UNATTRIBUTED) & (t >= start) & (t <= aligned)
    row[mask], how[mask] = SETUP, IN_SETUP


def _between(events: np.ndarray, t0: np.ndarray, end: np.ndarray, t: np.ndarray,
             row: np.ndarray, how: np.ndarray) -> None:
    """Launches between two events go to the nearer one."""
    todo = np.nonzero(row == UNATTRIBUTED)[0]
    if not len(todo) or not len(events):
        return
    rows = events[np.argsort(t0[events], kind="stable")]
    starts, ends = t0[rows], end[rows]
    j = np.searchsorted(starts, t[todo], side="right") - 1
    for n, k in zip(todo.tolist(), j.tolist()):
        if k < 0 or k + 1 >= len(rows):
            continue                 # before the first event or after the last: not between
        before, after = t[n] - ends[k], starts[k + 1] - t[n]
        row[n] = rows[k] if before <= after else rows[k + 1]
        how[n] = BETWEEN
