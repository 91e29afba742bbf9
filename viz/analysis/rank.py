"""Everything computed from one rank's trace alone: the map step of the analysis.

:func:`analyse_rank_file` loads one trace, computes its :class:`RankAnalysis` (op groups, op
and communication counts, what a failed rank was doing, its timeline lanes) and drops the trace:
each result is small next to the events it came from, so many ranks can be analysed one after
the other, or in worker processes, with one trace in memory at a time. Cross-rank analyses
(:mod:`viz.analysis`) read only these results.
"""
from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Optional

import numpy as np

from tracer.files import rundir
from tracer.files.device_format import DeviceRecords, read_device
from tracer.files.format import TraceError
from tracer.files.reader import Trace, load as load_trace
from tracer.kineto.chrome_trace import KinetoError, load_chrome_trace
from tracer.vocab.groups import group_ranks, process_group_name
from tracer.vocab.labels import PHASES, Phase
from tracer.vocab.ops import PSEUDO_OPS

from .callgraphs.op_groups import OpGroup, Split, group_ops, kernel_groups
from .device.device_lanes import on_device
from .device.gpu_attribution import DeviceSummary, RegionWork, attribute
from .memory.live_bytes import MemoryProfile, live_memory, memory_profile
from .timeline.columns import Records
from .timeline.intervals import Prefix
from .timeline.lanes import P2PEnd, RankLanes, counted_steps
from .timeline.rank_lanes import DRAWN_OPS, p2p_endpoints, rank_lanes
from .timeline.rank_rows import RankRows


@dataclass
class RankAnalysis:
    """One rank's trace, analysed."""

    rank: int
    path: str
    meta: dict[str, Any]          # the trace's metadata (docs/trace-format.md)
    warnings: list[str]           # a damaged tail, a recording that never closed
    events: int
    steps: list[int]              # step indices the trace holds
    op_groups: list[OpGroup]
    op_counts: dict[str, int]     # op overload -> calls (pseudo-ops left out)
    comm: list[CommRow]           # collectives by kind, phase and group
    lanes: RankLanes
    last_op: Optional[LastOp] = None     # what the rank did last (failed ranks)
    device: Optional[DeviceSummary] = None  # GPU activity, attributed (counts, times)
    counted_steps: tuple[int, ...] = ()   # the steps its time metrics count (counted_steps)
    counted_op_groups: list[OpGroup] = field(default_factory=list)   # of those steps only
    exports: tuple[str, ...] = ()  # torch.profiler exports merged into its GPU activity
    export_errors: list[str] = field(default_factory=list)   # exports that could not be used
    op_counts_by_phase: dict[str, dict[str, int]] = field(default_factory=dict)  # phase->op->n
    send_caps: dict[int, int] = field(default_factory=dict)  # row -> a capped send's ns (host)
    memory: Optional[MemoryProfile] = None   # its memory, where recorded (the default)
    counted_counts: Optional[RankCounts] = None   # its counts over counted_steps only

    @property
    def status(self) -> str:
        """The recorder's own status: ok | failed | interrupted | running (never closed)."""
        return self.meta.get("status", "running")

    @property
    def config(self) -> dict[str, Any]:
        return self.meta.get("config") or {}


def p2p_of_file(path: str, rank: int) -> Records[P2PEnd]:
    """The first pass over a rank's trace: its sends and receives (viz.analysis.timeline.assemble),
    as columns (a pipeline stage of a long run has thousands). Raises TraceError if the trace's own
    metadata says it is not rank ``rank``'s."""
    trace = load_trace(path)
    check_identity(trace, path, rank)
    return Records(P2PEnd, p2p_endpoints(RankRows(trace, rank)))


def check_identity(trace: Trace, path: str, rank: int) -> None:
    """The recorder names a trace file after its rank (renaming it when the process group says
    otherwise), so a file whose metadata names another rank, or a rank outside its world, was
    renamed or copied from elsewhere: using it would match collectives of different ranks."""
    meta = trace.meta
    own, size = meta.get("rank"), meta.get("world_size")
    if isinstance(own, int) and own != rank:
        raise TraceError(f"{path}: its metadata says rank {own}, not {rank} (renamed, or "
                         "copied from another run)")
    if isinstance(size, int) and rank >= size:
        raise TraceError(f"{path}: rank {rank} is outside its own world of {size} ranks")


def analyse_rank_file(path: str, rank: int, send_ends: dict[int, int], op_budget: int = DRAWN_OPS,
                      kineto: tuple[str, ...] = ()) -> RankAnalysis:
    """Load and analyse one rank's trace with its GPU activity: the device file beside it and
    any torch.profiler exports given (raises tracer.TraceError if unreadable)."""
    trace = load_trace(path)
    records, warnings, errors = device_records(path, rank, kineto)
    analysis = analyse_rank(trace, rank, send_ends, op_budget, records)
    analysis.warnings += warnings
    analysis.exports = tuple(e for e in kineto if e not in errors)
    analysis.export_errors = sorted(errors)
    return analysis


def device_records(path: str, rank: int, kineto: tuple[str, ...] = ()
                   ) -> tuple[Optional[DeviceRecords], list[str], list[str]]:
    """(DeviceRecords or None, warnings, exports that could not be used): the rank's device
    file beside its trace ``path``, and the torch.profiler exports given for it. A damaged
    export is used as far as it reads, said in one line; one whose GPU activity cannot be used
    at all is said in one line too, and the rank keeps what it had."""
    records: Optional[DeviceRecords] = None
    warnings: list[str] = []
    errors: list[str] = []
    device = rundir.device_file(os.path.dirname(path), rank)
    if os.path.exists(device):
        records, _, problem = read_device(device)
        if problem:
            warnings.append(f"{device}: {problem}; those are used")
    for export in kineto:
        try:
            more = load_chrome_trace(export)
        except KinetoError as exc:
            errors.append(export)
            kept = "the GPU time it recorded" if records is not None else "host time"
            warnings.append(f"{exc}; rank {rank} keeps {kept}")
            continue
        if not len(more):
            errors.append(export)
            warnings.append(f"{export}: no GPU activity in it (kernels, memcpys, memsets): "
                            "nothing to merge")
            continue
        if more.meta.get("damage_line"):
            warnings.append(more.meta["damage_line"])
        records = more if records is None else records.concat(more)
    return records, warnings, errors


def device_time_warnings(meta: dict[str, Any]) -> list[str]:
    """What went wrong recording the rank's GPU time (the trace's ``device_time``), in one
    line: its first error, and how many there were."""
    device = meta.get("device_time")
    if not isinstance(device, dict) or not device.get("error"):
        return []
    errors = device.get("errors")
    more = errors - 1 if isinstance(errors, int) and errors > 1 else 0
    return [f"device time: {device['error']}" + (f" (and {more} more error"
                                                 f"{'s' if more > 1 else ''})" if more else "")]


def analyse_rank(trace: Trace, rank: int, send_ends: dict[int, int], op_budget: int = DRAWN_OPS,
                 records: Optional[DeviceRecords] = None) -> RankAnalysis:
    """``send_ends``: the rank's send rows -> their matched receives' completions
    (viz.analysis.timeline.assemble.match_p2p); ``op_budget``: individual ops kept for drawing;
    ``records``: its GPU activity, which puts every time on the device clock."""
    dev = attribute(trace, records) if records is not None and len(records) else None
    rows = RankRows(trace, rank)
    # NOTE: on the device a send ends with its NCCL kernel: no receive completion to borrow
    lanes = rank_lanes(rows, send_ends if dev is None else {}, op_budget)
    if dev is not None:
        lanes = on_device(lanes, rows, dev, op_budget)
    caps = {} if dev is not None else send_caps(lanes)
    durations = dev.row_ns if dev is not None else host_durations(trace, caps)
    memory = memory_profile(trace)
    lanes = replace(lanes, live_memory=live_memory(memory, trace.clock_offset))
    counted = tuple(counted_steps(lanes))
    frames: dict[int, Split] = {}         # the stacks' frames, shared by both groupings
    work = dev.in_regions() if dev is not None else None
    groups = group_ops(trace, durations, frames) + kernel_groups(trace, work, None, frames)
    counted_groups = _groups_over(trace, counted, durations, frames, all_steps=groups,
                                  work=work)
    return RankAnalysis(
        rank=rank, path=trace.path, meta=trace.meta,
        warnings=list(trace.warnings) + list((trace.meta.get("imported") or {}).get("damage")
                                             or []) + device_time_warnings(trace.meta),
        events=len(trace), steps=recorded_steps(trace), op_groups=groups,
        op_counts=op_counts(trace), op_counts_by_phase=op_counts_by_phase(trace),
        comm=comm_rows(trace), lanes=lanes, last_op=last_op(trace),
        device=None if dev is None else dev.summary(trace.dictionary("op"), trace.col("op")),
        counted_steps=counted, send_caps=caps, memory=memory, counted_op_groups=counted_groups,
        counted_counts=_counts_over(trace, counted, counted_groups))


def send_caps(lanes: RankLanes) -> dict[int, int]:
    """trace row -> duration of each send whose end the timeline moved to its matched
    receive's completion (docs/metrics.md): a send posted early and waited late was not in
    flight all that time, in the op tables either."""
    comm = lanes.comm
    if not len(comm):
        return {}
    capped = comm.values("capped")
    index, start, end = comm.values("index"), comm.values("start"), comm.values("end")
    return {int(i): int(b - a) for i, a, b, c in zip(index, start, end, capped) if c}


def host_durations(trace: Trace, caps: dict[int, int]) -> Optional[np.ndarray]:
    """Each row's host duration with the capped sends' (``caps``), or None when none is
    capped (op_groups then takes the rows' own intervals)."""
    if not caps:
        return None
    t0, t1 = trace.col("t0"), trace.col("t1")
    out = np.where(t1 >= 0, t1 - t0, 0).clip(min=0)
    rows = np.fromiter(caps, dtype=np.int64, count=len(caps))
    out[rows] = np.fromiter(caps.values(), dtype=np.int64, count=len(caps))
    return out


def _groups_over(trace: Trace, steps: Iterable[int], durations: Optional[np.ndarray],
                 frames: Optional[dict[int, Split]] = None,
                 all_steps: Optional[list[OpGroup]] = None,
                 work: Optional[RegionWork] = None) -> list[OpGroup]:
    """The op groups of ``steps`` only (``all_steps``: the groups of every step, if known),
    with the GPU work ranges launched outside their events (``work``) by kernel."""
    mask = np.isin(trace.col("step"), sorted(steps))
    if mask.all():
        return all_steps if all_steps is not None else \
            group_ops(trace, durations, frames) + kernel_groups(trace, work, None, frames)
    return group_ops(trace.select(mask), None if durations is None else durations[mask],
                     frames) + kernel_groups(trace, work, mask, frames)


@dataclass
class RankCounts:
    """What a rank did in some steps only: the counting part of a RankAnalysis."""

    steps: list[int]
    op_groups: list[OpGroup]
    op_counts: dict[str, int]
    comm: list[CommRow]
    op_counts_by_phase: dict[str, dict[str, int]]


def count_rank_file(path: str, rank: int, steps: frozenset[int], kineto: tuple[str, ...] = (),
                    caps: Optional[dict[int, int]] = None) -> RankCounts:
    """Op groups (device time where there is GPU activity; else host time, the sends in
    ``caps`` capped as in the analysis), op and communication counts of one rank's trace over
    ``steps`` only."""
    trace = load_trace(path)
    records, _, _ = device_records(path, rank, kineto)
    dev = attribute(trace, records) if records is not None and len(records) else None
    groups = _groups_over(trace, steps, dev.row_ns if dev is not None
                          else host_durations(trace, caps or {}),
                          work=dev.in_regions() if dev is not None else None)
    return _counts_over(trace, steps, groups)


def _counts_over(trace: Trace, steps: Iterable[int], groups: list[OpGroup]) -> RankCounts:
    """The op and communication counts of ``trace`` over ``steps`` only, beside their op
    ``groups``."""
    mask = np.isin(trace.col("step"), sorted(steps))
    if not mask.all():
        trace = trace.select(mask)
    return RankCounts(recorded_steps(trace), groups, op_counts(trace), comm_rows(trace),
                      op_counts_by_phase(trace))


def path_modules_file(path: str, rank: int, intervals: Iterable[tuple[int, int, int]]
                      ) -> dict[int, dict[str, int]]:
    """step -> {module: ns} of this rank's compute ops inside ``intervals`` ((step, start, end)
    on rank 0's clock, disjoint): the module shares of the critical path on this rank. Host
    time between ops on the path is ``(between ops)``."""
    trace = load_trace(path)
    rows = RankRows(trace, rank)
    sel = np.nonzero(rows.is_compute)[0]
    sel = sel[np.argsort(rows.t0[sel], kind="stable")]
    t0, t1 = rows.t0[sel], rows.t1[sel]
    longest = int((t1 - t0).max()) if len(sel) else 0
    module = trace.col("module")[sel]
    names = trace.dictionary("module")
    out: dict[int, dict[str, int]] = {}
    by_step: dict[int, list[tuple[int, int]]] = {}
    for s, a, b in intervals:
        by_step.setdefault(s, []).append((a, b))
    for step in sorted(by_step):
        mine = sorted(by_step[step])
        covered = Prefix(np.array(mine, dtype=np.int64).reshape(-1, 2))
        # only ops that can reach the step's intervals: a run of many steps stays linear
        i, j = np.searchsorted(t0, [mine[0][0] - longest, mine[-1][1]], side="left")
        inside = covered.length(t0[i:j], t1[i:j])
        by_module = np.bincount(module[i:j] + 1, weights=inside, minlength=len(names) + 1)
        shares = {("(no module)" if i == 0 else names[i - 1]): int(ns)
                  for i, ns in enumerate(by_module.tolist()) if ns > 0}
        host = sum(b - a for a, b in mine) - sum(shares.values())
        if host > 0:
            shares["(between ops)"] = host
        out[step] = shares
    return out


def recorded_steps(trace: Trace) -> list[int]:
    steps = trace.col("step")
    return sorted(set(np.unique(steps).tolist())) if len(steps) else []


def op_counts(trace: Trace) -> dict[str, int]:
    """Dispatched ops by overload name (the tracer's pseudo-ops left out)."""
    names = trace.dictionary("op")
    counts = np.bincount(trace.col("op"), minlength=len(names)) if len(trace) else \
        np.zeros(len(names), dtype=np.int64)
    return {name: int(n) for name, n in zip(names, counts) if n and name not in PSEUDO_OPS}


def op_counts_by_phase(trace: Trace) -> dict[str, dict[str, int]]:
    """phase name -> op overload -> calls (pseudo-ops left out), phases in PHASES order."""
    names = trace.dictionary("op")
    if not len(trace) or not names:
        return {}
    key = trace.col("phase").astype(np.int64) * len(names) + trace.col("op")
    counts = np.bincount(key, minlength=len(PHASES) * len(names))
    out: dict[str, dict[str, int]] = {}
    for k in np.nonzero(counts)[0].tolist():
        phase, op = divmod(k, len(names))
        if names[op] not in PSEUDO_OPS:
            out.setdefault(PHASES[phase], {})[names[op]] = int(counts[k])
    return {p: out[p] for p in PHASES if p in out}


@dataclass(frozen=True)
class CommRow:
    """A rank's collectives and P2P of one kind, phase and process group: how many, how many
    bytes it handed to them."""

    kind: str
    phase: Phase
    group: tuple[int, ...]        # the global ranks of the process group
    process_group: Optional[str]  # torch's name of it, where the trace keeps one
    count: int
    bytes: int


def comm_rows(trace: Trace) -> list[CommRow]:
    """Collectives and P2P aggregated by (kind, phase, group): :class:`CommRow` s."""
    kind, group = trace.col("kind"), trace.col("group")
    mask = kind >= 0
    if not mask.any():
        return []
    kinds, groups = trace.dictionary("kind"), trace.dictionary("group")
    phase, nbytes = trace.col("phase")[mask], trace.col("bytes")[mask]
    totals: defaultdict[tuple[int, int, int], list[int]] = defaultdict(lambda: [0, 0])  # n, bytes
    for k, p, g, b in zip(kind[mask].tolist(), phase.tolist(), group[mask].tolist(),
                          nbytes.tolist()):
        entry = totals[(k, p, g)]
        entry[0] += 1
        entry[1] += max(b, 0)
    return [CommRow(kinds[k], PHASES[p], group_ranks(groups[g]), process_group_name(groups[g]),
                    count, total)
            for (k, p, g), (count, total) in sorted(totals.items(), key=lambda kv: (
                kinds[kv[0][0]], kv[0][1], groups[kv[0][2]]))]


@dataclass(frozen=True)
class LastCollective:
    """A rank's last collective: what, over which group, its sequence number, whether it
    completed."""

    kind: str
    group: str                    # the recorded process group text
    seq: int
    completed: bool


@dataclass(frozen=True)
class LastOp:
    """What a rank was doing last (a failed rank's last steps)."""

    op: Optional[str] = None              # its last recorded op
    where: Optional[tuple[str, int]] = None   # (file, line) of its innermost frame
    collective: Optional[LastCollective] = None


def last_op(trace: Trace) -> Optional[LastOp]:
    """What a rank was doing last: its last recorded op, where, and its last collective; None
    when the trace holds neither."""
    op = where = collective = None
    ops = trace.dictionary("op")
    codes = trace.col("op")
    real = np.nonzero(~np.isin(codes, [trace.code("op", name) for name in PSEUDO_OPS]))[0]
    if len(real):
        i = int(real[-1])
        op = ops[codes[i]]
        stack = trace.stack(int(trace.col("stack")[i]))
        if stack:
            where = (stack[0][0], stack[0][1])
    comm = np.nonzero(trace.col("kind") >= 0)[0]
    if len(comm):
        i = int(comm[-1])
        collective = LastCollective(trace.dictionary("kind")[trace.col("kind")[i]],
                                    trace.dictionary("group")[trace.col("group")[i]],
                                    int(trace.col("seq")[i]), bool(trace.col("t1")[i] >= 0))
    if op is None and collective is None:
        return None
    return LastOp(op, where, collective)
