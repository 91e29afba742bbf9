"""One torch.profiler export -> paratrace's own trace files, so every analysis runs on it.

:func:`import_export` reads an export once, as a stream (:mod:`tracer.kineto.events`), turns
its host events into trace rows (:mod:`tracer.kineto.host`) and writes
``rank-<R>.arrow`` (:mod:`tracer.files.format`) and, when it has GPU activity,
``rank-<R>.device.arrow`` (:mod:`tracer.files.device_format`) into a directory. The trace's clock
is the export's: Unix nanoseconds (``baseTimeNanoseconds`` plus ``ts``, or absolute ``ts`` from
torch before 2.1), so the device file needs no clock mapping (one identity clock pair), and
ranks are aligned by their hosts' clocks. The trace's metadata says where it came from
(``imported``): the export, what could not be derived from it (stacks without with_stack ...),
and what was wrong with it (events dropped, a truncated tail). An export taken with
``profile_memory=True`` gets memory rows (:mod:`tracer.kineto.allocations`). Torch-free.
"""
from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Optional, TypedDict

import numpy as np

from tracer.files.device_format import DeviceWriter
from tracer.files.format import FORMAT_VERSION, TraceWriter
from tracer.vocab import ops
from tracer.vocab.labels import PHASE_BACKWARD, PHASE_FORWARD, PHASE_OPTIMIZER
from tracer.vocab.ops import P2P_KINDS

from .allocations import allocated_peak, memory_columns, memory_device
from .chrome_trace import damage_line, device_records, rank_of, time_base
from .collectives import ProcessGroups, kind_of_kernel
from .events import ExportEvents, HostEvents, collect
from .host import (ANN, OP, RPC, STEP, Walked, annotation_text, comm_rows, flow_links, frame_of,
                   order_of, phases, role_of, stack_text, unfold, walk)
from .stream import ExportStream

_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
_STDLIB = frozenset(getattr(sys, "stdlib_module_names", ()))
MAX_WORLD = 1 << 20


@dataclass
class Imported:
    """What importing one export gave (small: it travels back from a worker process)."""

    export: str
    rank: Optional[int]
    trace: str
    device: Optional[str]
    events: int
    activities: int
    world_size: Optional[int]
    line: Optional[str] = None            # what was wrong with the export, one line
    missing: list[str] = field(default_factory=list)   # what it cannot tell (front page)


class HostRows(TypedDict):
    """The trace rows of an export's host events."""

    columns: dict[str, np.ndarray]          # numpy, -1 null, rows in start order
    dictionaries: dict[str, list[str]]
    threads: dict[str, int]                 # the trace's thread number (text) -> Kineto tid


def import_export(path: str, traces_dir: str, name: str, rank: Optional[int] = None,
                  limit: Optional[int] = None) -> Imported:
    """Import ``path`` into ``traces_dir/<name>.arrow`` (and ``<name>.device.arrow``).
    ``rank``: the rank given on the command line, else the export's own. Raises
    KinetoError when the file is no export at all."""
    events = collect(ExportStream(path, limit), host=True)
    rank = rank if rank is not None else rank_of(events.top)
    first = _first_ns(events)
    base, notes = time_base(events.top, first)
    missing: list[str] = []
    if base is None:
        base = 0
        missing.append("how ranks line up in time (relative times without "
                       "baseTimeNanoseconds: each rank starts at its profiler's start)")
    rows, found = host_rows(events, base)
    records = device_records(events, base)
    activities = int((~records.is_launch).sum()) if len(records) else 0
    missing += _missing(found, activities)
    info = events.top.get("distributedInfo")
    info = info if isinstance(info, dict) else {}
    world = info.get("world_size") if type(info.get("world_size")) is int else None
    if world is not None and not (rank or 0) < world <= MAX_WORLD:
        notes.append(f"distributedInfo.world_size is {world}, not a world of rank "
                     f"{rank or 0} (at most {MAX_WORLD:,}): ignored")
        world = None
    memory = memory_columns(events.memory, base, _op_rows(rows),
                            {tid: int(code) for code, tid in rows["threads"].items()})
    missing += _memory_missing(events.memory, rows["columns"]["phase"])
    line = damage_line(events, notes)
    meta = _meta(path, rank, world, info, rows, events, activities, missing)
    meta["imported"]["damage"] = [line] if line else []
    meta["imported"]["memory_device"] = memory_device(events.memory)
    meta["imported"]["memory_allocated_peak"] = allocated_peak(events.memory)
    trace_path = os.path.join(traces_dir, f"{name}.arrow")
    writer = TraceWriter(trace_path, meta, memory=memory is not None)
    writer.write_columns(rows["columns"], rows["dictionaries"])
    if memory is not None:
        writer.write_columns(memory, rows["dictionaries"])
    writer.close()
    device_path = None
    if activities:
        device_path = os.path.join(traces_dir, f"{name}.device.arrow")
        device = DeviceWriter(device_path, {"rank": rank, "source": "torch.profiler"})
        device.write(records, {"window": 0, "devices": records.meta.get("devices")})
        device.close()
    return Imported(path, rank, trace_path, device_path, writer.events, activities, world,
                    line, missing)


def _first_ns(events: ExportEvents) -> Optional[int]:
    starts = [int(events.device["start"].min())] if len(events.device["start"]) else []
    if events.host is not None and len(events.host):
        starts.append(int(np.frombuffer(events.host.start, dtype=np.int64).min()))
    return min(starts) if starts else None


def _op_rows(rows: HostRows) -> dict[str, np.ndarray]:
    """The op rows' t0, t1, thread, kind, step and phase (pseudo-op rows left out), in t0
    order."""
    cols = rows["columns"]
    pseudo = [i for i, name in enumerate(rows["dictionaries"]["op"])
              if name in ops.PSEUDO_OPS]
    keep = ~np.isin(cols["op"], pseudo)
    return {k: cols[k][keep] for k in ("t0", "t1", "thread", "kind", "step", "phase")}


def _memory_missing(memory: dict[str, np.ndarray], phase: np.ndarray) -> list[str]:
    if memory_device(memory) is None:
        return ["memory (profiled without profile_memory)"]
    if not np.isin(phase, (PHASE_FORWARD, PHASE_BACKWARD, PHASE_OPTIMIZER)).any():
        return ["which memory is gradients, optimizer state or activations (no forward, "
                "backward or optimizer op to tell them by, and an export gives addresses and "
                "sizes, not tensors: all temporaries), parameters, and memory made before the "
                "export began"]
    return ["parameters, and memory made before the export began (an export gives the "
            "allocator's addresses and sizes, not tensors: gradients, optimizer state and "
            "activations are told by the phases around each block, docs/kineto.md)"]


def _missing(found: dict[str, bool], activities: int) -> list[str]:
    """What the export cannot tell, for the report's front page."""
    out = []
    if not found["frames"]:
        out.append("stacks and source lines (profiled without with_stack)")
    if not found["modules"]:
        out.append("modules (profiled without with_stack and with_modules)")
    if not found["shapes"]:
        out.append("input shapes and FLOPs (profiled without record_shapes)")
    if not activities:
        out.append("GPU time (no GPU activity in the profile: times are host times)")
    if not found["steps"]:
        out.append("steps (no ProfilerStep#: the profile is one step)")
    if found["unknown_groups"]:
        out.append("the process groups of some collectives (not in distributedInfo.pg_config)")
    return out


def host_rows(events: ExportEvents, base: int) -> tuple[HostRows, dict[str, bool]]:
    """(columns and dictionaries of the trace rows, what was found) of an export collected
    with its host events."""
    host = events.host
    assert host is not None, "collected without host events"
    names = host.names.values
    cats = np.frombuffer(host.cat, dtype=np.int8) if len(host) else np.zeros(0, np.int8)
    codes = np.frombuffer(host.name, dtype=np.int32) if len(host) else np.zeros(0, np.int32)
    role_table: dict[tuple[int, int], int] = {}
    for c, n in set(zip(cats.tolist(), codes.tolist())):
        role_table[(c, n)] = role_of(c, names[n])
    roles = np.array([role_table[k] for k in zip(cats.tolist(), codes.tolist())], np.int8)
    order, end = order_of(host)
    rows = walk(host, order, roles, end)
    info = events.top.get("distributedInfo")
    groups = ProcessGroups(info if isinstance(info, dict) else {})
    is_op = np.array([roles[e] in (OP, RPC) for e in rows.event], dtype=bool)
    links = flow_links(rows, host, events.flows, is_op)
    comm = comm_rows(rows, host, roles, groups, _kernel_kinds(rows, host, events, is_op))
    ann_chains = unfold(rows.anns, lambda chain: tuple(names[c] for c in chain))
    phase = phases(rows, host, roles, ann_chains, set(links.values()), comm)
    steps = _profiler_steps(host, roles, names)
    columns, dictionaries, threads = _columns(rows, host, roles, base, links, comm, phase,
                                              steps, ann_chains)
    found = {"frames": bool(rows.stacks), "modules": bool(rows.modules),
             "shapes": len(host.shape_texts.values) > 0, "steps": bool(steps),
             "unknown_groups": any(c["group"] == "?" for c in comm.values())}
    return {"columns": columns, "dictionaries": dictionaries, "threads": threads}, found


def _kernel_kinds(rows: Walked, host: HostEvents, events: ExportEvents, is_op: np.ndarray
                  ) -> dict[int, str]:
    """op row -> the collective kind of the NCCL kernels it launched (where the name says)."""
    dev = events.device
    names = events.device_names
    if not len(dev["kind"]):
        return {}
    kind_of = {i: kind_of_kernel(n) for i, n in enumerate(names) if "nccl" in n.lower()}
    nccl = (dev["kind"] == 0) & np.isin(dev["name"], list(kind_of) or [-1])
    corr_kind = dict(zip(dev["corr"][nccl].tolist(),
                         [kind_of[n] for n in dev["name"][nccl].tolist()]))
    launch = (dev["kind"] >= 3) & np.isin(dev["corr"], list(corr_kind) or [-1])
    if not launch.any():
        return {}
    start = np.frombuffer(host.start, dtype=np.int64)
    stop = start + np.frombuffer(host.dur, dtype=np.int64)
    tid = np.frombuffer(host.tid, dtype=np.int64)
    op_rows = np.nonzero(is_op)[0]
    op_events = np.array(rows.event, dtype=np.int64)[op_rows]
    l_tid, l_at = dev["tid"][launch], dev["start"][launch]
    l_kind = [corr_kind[c] for c in dev["corr"][launch].tolist()]
    out: dict[int, str] = {}
    for t in np.unique(l_tid).tolist():
        mine = np.nonzero(tid[op_events] == t)[0]          # op rows do not nest on a thread
        mine = mine[np.argsort(start[op_events[mine]], kind="stable")]
        here = np.nonzero(l_tid == t)[0]
        j = np.searchsorted(start[op_events[mine]], l_at[here], side="right") - 1
        inside = (j >= 0) & (stop[op_events[mine[np.maximum(j, 0)]]] >= l_at[here])
        for k, jj in zip(here[inside].tolist(), j[inside].tolist()):
            kind = l_kind[k]
            if kind:
                out.setdefault(int(op_rows[mine[jj]]), kind)
    return out


def _profiler_steps(host: HostEvents, roles: np.ndarray, names: list[str]
                    ) -> list[tuple[int, int, int]]:
    """(N, start, end) of each ProfilerStep#N range, by start."""
    out = []
    for e in np.nonzero(roles == STEP)[0].tolist():
        match = _STEP_RE.match(names[host.name[e]])
        if match:
            out.append((int(match.group(1)), host.start[e], host.start[e] + host.dur[e]))
    return sorted(set(out), key=lambda s: s[1])


def _steps_of(t0: np.ndarray, steps: list[tuple[int, int, int]]
              ) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """(step of each row, the step markers (step, time)): a row belongs to the last step
    started at or before it (the first step before any); after a step that no next step
    follows, to a step of its own."""
    if not steps:
        return np.zeros(len(t0), dtype=np.int64), []
    markers = []
    for i, (n, a, b) in enumerate(steps):
        markers.append((n, a))
        if i + 1 == len(steps) or steps[i + 1][0] != n + 1:
            markers.append((n + 1, b))          # its end: what follows is not in it
    markers.sort(key=lambda m: m[1])
    times = np.array([m[1] for m in markers], dtype=np.int64)
    numbers = np.array([m[0] for m in markers], dtype=np.int64)
    j = np.searchsorted(times, t0, side="right") - 1
    return numbers[np.maximum(j, 0)], markers


def _columns(rows: Walked, host: HostEvents, roles: np.ndarray, base: int,
             links: dict[int, int], comm: dict[int, dict[str, Any]], phase: list[int],
             steps: list[tuple[int, int, int]], ann_chains: list[tuple[str, ...]]
             ) -> tuple[dict[str, np.ndarray], dict[str, list[str]], dict[str, int]]:
    """The trace's columns (numpy, -1 null) and dictionaries, rows in start order; the
    trace's thread numbers (text) -> Kineto tids."""
    names = host.names.values
    events = np.array(rows.event, dtype=np.int64)
    start = np.frombuffer(host.start, dtype=np.int64)[events] if len(events) else \
        np.zeros(0, np.int64)
    dur = np.frombuffer(host.dur, dtype=np.int64)[events] if len(events) else start
    step, markers = _steps_of(start, steps)
    stacks = unfold(rows.stacks, lambda chain: stack_text(tuple(
        frame_of(names[c], _STDLIB) for c in chain)))
    modules = unfold(rows.modules, lambda chain: ".".join(
        names[c][len("nn.Module: "):] for c in chain))
    anns = [annotation_text(c) for c in ann_chains]
    op_names: list[str] = []
    op_code: dict[str, int] = {}

    def code(name: str) -> int:
        if name not in op_code:
            op_code[name] = len(op_names)
            op_names.append(name)
        return op_code[name]
    op = np.array([code(ops.OP_ANNOTATION if roles[e] == ANN else
                        op_name(names[host.name[e]])) for e in rows.event], dtype=np.int64)
    stack = np.array(rows.stack, dtype=np.int64)
    module = np.array(rows.module, dtype=np.int64)
    fwd_stack = np.full(len(events), -1, dtype=np.int64)
    for r, b in enumerate(rows.bwd):
        f = links.get(b) if b >= 0 else None
        if f is not None:
            fwd_stack[r], module[r] = stack[f], module[f]
    cols = {"t0": start + base, "t1": start + dur + base, "op": op,
            "phase": np.array(phase, dtype=np.int64), "module": module, "stack": stack,
            "fwd_stack": fwd_stack, "annotation": np.array(rows.ann, dtype=np.int64),
            "step": step, "shapes": np.frombuffer(host.shapes, dtype=np.int32)[events]
            .astype(np.int64) if len(events) else np.zeros(0, np.int64)}
    threads = _threads(host, events)
    cols["thread"] = np.array([threads[host.tid[e]] for e in rows.event], dtype=np.int64)
    dictionaries: dict[str, list[str]] = {
        "op": op_names, "module": modules, "stack": stacks, "fwd_stack": stacks,
        "annotation": anns, "shapes": list(host.shape_texts.values)}
    _comm_columns(cols, dictionaries, comm, len(events))
    _add_markers(cols, dictionaries, markers, base)
    order = np.argsort(cols["t0"], kind="stable")
    cols = {k: v[order] for k, v in cols.items()}
    return cols, dictionaries, {str(v): int(k) for k, v in threads.items()}


# ops whose overload the analyses name (a functional collective's wait blocks the host: it is
# no compute); an export names no overload, and the others keep none
_OVERLOADS = {"_c10d_functional::wait_tensor": "_c10d_functional.wait_tensor.default",
              "c10d_functional::wait_tensor": "c10d_functional.wait_tensor.default"}


def op_name(kineto: str) -> str:
    """``aten::mm`` -> ``aten.mm``: the trace's op name of an export's op."""
    return _OVERLOADS.get(kineto) or kineto.replace("::", ".", 1)


def _threads(host: HostEvents, events: np.ndarray) -> dict[int, int]:
    """Kineto thread id -> the trace's small thread number: the thread with the most rows
    first (the training loop's), then by first appearance."""
    tids = [host.tid[e] for e in events.tolist()]
    counts: dict[int, int] = {}
    for t in tids:
        counts[t] = counts.get(t, 0) + 1
    ordered = sorted(counts, key=lambda t: -counts[t])
    return {t: i for i, t in enumerate(ordered[:32767])}


def _comm_columns(cols: dict[str, np.ndarray], dictionaries: dict[str, list[str]],
                  comm: dict[int, dict[str, Any]], n: int) -> None:
    kinds: list[str] = []
    groups: list[str] = []
    dtypes: list[str] = []
    codes: dict[str, dict[str, int]] = {"kind": {}, "group": {}, "dtype": {}}
    lists = {"kind": kinds, "group": groups, "dtype": dtypes}
    out = {k: np.full(n, -1, dtype=np.int64) for k in ("kind", "group", "dtype", "peer",
                                                         "bytes", "seq", "cid", "t_ret")}
    counters: dict[tuple[str, bool], int] = {}
    for cid, (r, c) in enumerate(sorted(comm.items(), key=lambda rc: cols["t0"][rc[0]])):
        for key in ("kind", "group", "dtype"):
            value = c[key]
            if value is not None:
                if value not in codes[key]:
                    codes[key][value] = len(lists[key])
                    lists[key].append(value)
                out[key][r] = codes[key][value]
        seq = c["seq"]
        counter = (c["group"], c["kind"] in P2P_KINDS)
        if seq is None:
            seq = counters.get(counter, 0)
        counters[counter] = seq + 1
        # a collective of a group the export does not name is never matched across ranks:
        # counted in one '?' group, collectives of different groups would meet
        out["seq"][r], out["cid"][r] = (-1 if c["group"] == "?" else seq), cid
        peer = c["peer"]
        out["peer"][r] = peer if peer is not None and 0 <= peer < 1 << 31 else -1
        nbytes = c["elements"] * c["size"] if c["elements"] is not None else 0
        if 0 < nbytes < 1 << 62:
            out["bytes"][r] = nbytes
        out["t_ret"][r] = cols["t1"][r]
    cols.update(out)
    dictionaries.update(lists)


def _add_markers(cols: dict[str, np.ndarray], dictionaries: dict[str, list[str]],
                 markers: list[tuple[int, int]], base: int) -> None:
    if not markers:
        return
    ops_list = dictionaries["op"]
    if ops.OP_STEP not in ops_list:
        ops_list.append(ops.OP_STEP)
    code = ops_list.index(ops.OP_STEP)
    m = len(markers)
    extra = {k: np.full(m, -1, dtype=np.int64) for k in cols}
    extra["t0"] = extra["t1"] = np.array([t + base for _, t in markers], dtype=np.int64)
    extra["op"] = np.full(m, code, dtype=np.int64)
    extra["step"] = np.array([s for s, _ in markers], dtype=np.int64)
    extra["phase"] = np.zeros(m, dtype=np.int64)
    extra["thread"] = np.zeros(m, dtype=np.int64)
    for k in cols:
        cols[k] = np.concatenate([cols[k], extra[k]])


def _meta(path: str, rank: Optional[int], world: Optional[int], info: dict[str, Any],
          rows: HostRows, events: ExportEvents, activities: int, missing: list[str]
          ) -> dict[str, Any]:
    t0 = rows["columns"]["t0"]
    start = int(t0.min()) if len(t0) else 0
    end = int(rows["columns"]["t1"].max()) if len(t0) else 0
    absolute = start >= 10 ** 17
    meta: dict[str, Any] = {
        "format_version": FORMAT_VERSION, "rank": rank if rank is not None else 0,
        "world_size": world, "backend": info.get("backend"), "start_ns": start,
        "end_ns": end, "status": "ok", "host": str(events.top.get("host_name") or ""),
        "argv": [], "options": {"device_time": bool(activities)},
        "clock_pairs": [{"perf_ns": 0, "unix_ns": 0}], "threads": rows["threads"],
        "imported": {"from": "torch.profiler", "export": os.path.abspath(path),
                     "bytes": events.bytes_read, "items": events.items,
                     "missing": missing}}
    if absolute:
        meta["start_unix"] = start / 1e9
        meta["end_unix"] = end / 1e9
    if activities:
        meta["device_time"] = {"source": "torch.profiler", "windows": 1, "error": None}
    if world is None:
        meta.pop("world_size")
    return meta

