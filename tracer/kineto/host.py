"""Host events of a torch.profiler export -> the rows of a paratrace trace.

A recording has one row per op the dispatch mode saw; an export nests its events instead
(``python_function`` frames around ``cpu_op`` ops around their inner ops around the runtime
calls). :func:`host_rows` walks each thread's events in start order, keeping what encloses
the current one, and writes:

- an **op row** for each ``cpu_op`` of an op namespace (``aten::mm``, ``c10d::allreduce_``,
  a custom ``mylib::op``) that no other op encloses: the op the program called, not the ops it
  decomposed into, so nothing is counted twice (``aten::linear``, not also its ``addmm``);
  a ``record_param_comms`` no op encloses is a row too;
- its **stack** from the enclosing ``python_function`` frames (with_stack; innermost first, a
  frame's line is where its function starts, which is what the profiler records), its
  **module** from the enclosing ``nn.Module: <Class>_<k>`` frames (with_modules), its
  **shapes** from ``Input Dims`` and ``Input type`` (record_shapes);
- its **phase**: an enclosing range naming one (``Optimizer.step#...`` -> optimizer, as the
  recorder reads labels); backward inside the autograd engine's
  ``autograd::engine::evaluate_function`` (collectives there, DDP's, grad_sync); forward in a
  module, or when it ran with grad mode on (a ``fwdbwd`` flow starts at it, or it carries an
  autograd ``Sequence number``), as the recorder decides; else other.
  Backward ops take the stack and module of the forward op that made their node (the flow);
- its **step** from ``ProfilerStep#N`` (step N), every step kept;
- an annotation row for each other ``user_annotation`` (record_function) range, and a step
  marker where each ProfilerStep starts (and one where the last ends).

Collectives get their kind, group, bytes, dtype, peer and sequence number from
:mod:`tracer.kineto.collectives`. Torch-free.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, TypeVar, Union

import numpy as np

from tracer.vocab.labels import (PHASE_BACKWARD, PHASE_FORWARD, PHASE_GRAD_SYNC, PHASE_OPTIMIZER,
                                 PHASE_OTHER, PHASE_RECOMPUTE, phase_of_label)

from .collectives import ProcessGroups, dtype_of, kind_of_name, peer_of, tensor_input
from .events import ANNOTATION, CPU_OP, Flows, HostEvents, OP_NAME

# roles of an event, from its category and name
NONE, OP, RPC, BWD, STEP, ANN, COMM_ANN, FRAME, MODULE = range(9)
_NOT_OPS = ("torch", "autograd", "c10", "profiler")
_FRAME = re.compile(r"^(.*)\((\d+)\): (.*)$")
_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_LIBRARY_TOPS = ("torch",)
_OVERRIDE_BACKWARD = (PHASE_RECOMPUTE, PHASE_GRAD_SYNC, PHASE_OPTIMIZER)
_Text = TypeVar("_Text")


def role_of(cat: int, name: str) -> int:
    if cat == CPU_OP:
        if name == "record_param_comms":
            return RPC
        if name.startswith("autograd::engine::evaluate_function"):
            return BWD
        if _STEP.match(name):
            return STEP
        if OP_NAME.match(name) and name.split("::", 1)[0] not in _NOT_OPS:
            return OP
        return NONE
    if cat == ANNOTATION:
        if _STEP.match(name):
            return STEP
        return COMM_ANN if name.startswith(("nccl:", "gloo:")) else ANN
    if name.startswith("nn.Module: "):
        return MODULE
    return FRAME if _FRAME.match(name) else NONE


def frame_of(name: str, stdlib: frozenset[str]) -> list[Union[str, int]]:
    """``torch/nn/modules/linear.py(125): forward`` -> [file, line, function, qualname]. The
    profiler writes paths relative to the sys.path entry they were found under; torch's and
    the standard library's are marked as library frames
    (viz.analysis.callgraphs.source_files.is_library) the way a recording's absolute paths are."""
    match = _FRAME.match(name)
    assert match is not None, f"not a frame: {name}"     # role_of said FRAME
    file, line, function = match.groups()
    top = file.split("/", 1)[0]
    if not file.startswith(("/", "<")):
        if top in _LIBRARY_TOPS:
            file = "/site-packages/" + file
        elif top.removesuffix(".py") in stdlib:
            file = "/lib/python3/" + file
    return [file, int(line), function, function]


@dataclass
class Walked:
    """What the walk found, per op or annotation row (in row order)."""

    event: list[int] = field(default_factory=list)      # the row's event index
    stack: list[int] = field(default_factory=list)      # stack id (-1: none)
    module: list[int] = field(default_factory=list)     # module path id
    ann: list[int] = field(default_factory=list)        # annotation stack id
    bwd: list[int] = field(default_factory=list)        # enclosing evaluate_function event
    owner: dict[int, int] = field(default_factory=dict)     # comm event -> the row it is of
    # (parent id, name code) -> id: of frames, module names, annotation labels
    stacks: dict[tuple[int, int], int] = field(default_factory=dict)
    modules: dict[tuple[int, int], int] = field(default_factory=dict)
    anns: dict[tuple[int, int], int] = field(default_factory=dict)


def walk(host: HostEvents, order: np.ndarray, roles: np.ndarray, end: np.ndarray) -> Walked:
    """Every thread's events in start order (``order``), with what encloses each."""
    out = Walked()
    tid, start, name = host.tid, host.start, host.name
    stacks, modules, anns = out.stacks, out.modules, out.anns
    open_: list[tuple[int, int, int, int, int, int]] = []
    last_tid = None
    stack = module = ann = bwd = op_row = -1
    for e in order.tolist():
        t, s = tid[e], start[e]
        if t != last_tid:
            open_.clear()
            stack = module = ann = bwd = op_row = -1
            last_tid = t
        while open_ and open_[-1][0] <= s:
            _, stack, module, ann, bwd, op_row = open_.pop()
        role = roles[e]
        if role == NONE or role == STEP:
            continue
        saved = (end[e], stack, module, ann, bwd, op_row)
        if role == FRAME:
            stack = stacks.setdefault((stack, name[e]), len(stacks))
        elif role == MODULE:
            module = modules.setdefault((module, name[e]), len(modules))
        elif role == ANN:
            ann = anns.setdefault((ann, name[e]), len(anns))
            _row(out, e, stack, module, ann, bwd)
        elif role == BWD:
            bwd = e
        elif role == COMM_ANN or role == RPC:
            if op_row >= 0 or role == COMM_ANN:
                out.owner[e] = op_row
            else:
                op_row = _row(out, e, stack, module, ann, bwd)     # no op encloses it
                out.owner[e] = op_row
        elif op_row < 0:                                          # OP, outermost
            op_row = _row(out, e, stack, module, ann, bwd)
        else:
            continue                                              # an op inside an op
        open_.append(saved)
    return out


def _row(out: Walked, e: int, stack: int, module: int, ann: int, bwd: int) -> int:
    out.event.append(e)
    out.stack.append(stack)
    out.module.append(module)
    out.ann.append(ann)
    out.bwd.append(bwd)
    return len(out.event) - 1


def unfold(ids: dict[tuple[int, int], int], text: Callable[[tuple[int, ...]], _Text]
           ) -> list[_Text]:
    """Texts of interned chains ((parent id, value) -> id, ids 0 to n-1): each id's values,
    outermost first, made into a text by ``text``."""
    chains: list[tuple[int, ...]] = [()] * len(ids)
    for (parent, value), i in sorted(ids.items(), key=lambda kv: kv[1]):
        chains[i] = (chains[parent] if parent >= 0 else ()) + (value,)
    return [text(c) for c in chains]


def order_of(host: HostEvents) -> tuple[np.ndarray, np.ndarray]:
    """(start order of the events, thread by thread; their ends)."""
    start = np.frombuffer(host.start, dtype=np.int64) if len(host) else np.zeros(0, np.int64)
    dur = np.frombuffer(host.dur, dtype=np.int64) if len(host) else np.zeros(0, np.int64)
    tid = np.frombuffer(host.tid, dtype=np.int64) if len(host) else np.zeros(0, np.int64)
    cat = np.frombuffer(host.cat, dtype=np.int8) if len(host) else np.zeros(0, np.int8)
    # enclosing first: earlier start, then longer, then frames before annotations before ops
    rank_of_cat = np.array([2, 1, 0], dtype=np.int8)[cat]
    order = np.lexsort((np.arange(len(start)), rank_of_cat, -dur, start, tid))
    return order, start + dur


def flow_links(rows: Walked, host: HostEvents, flows: Flows, is_op: np.ndarray
               ) -> dict[int, int]:
    """evaluate_function event -> the row of the forward op that created its autograd node,
    from the ``fwdbwd`` flows (start: in the forward op; end: at the backward node)."""
    if not len(flows.id):
        return {}
    start = np.frombuffer(host.start, dtype=np.int64)
    end = start + np.frombuffer(host.dur, dtype=np.int64)
    tid = np.frombuffer(host.tid, dtype=np.int64)
    events = np.array(rows.event, dtype=np.int64)
    fwd = _point_owner(events[is_op], start, end, tid, flows, False)
    bwd_events = np.unique(np.array([b for b in rows.bwd if b >= 0], dtype=np.int64))
    bwd = _point_owner(bwd_events, start, end, tid, flows, True)
    row_of = {int(e): r for r, e in enumerate(rows.event)}
    return {b: row_of[f] for i, b in bwd.items() if (f := fwd.get(i)) is not None}


def _point_owner(candidates: np.ndarray, start: np.ndarray, end: np.ndarray, tid: np.ndarray,
                 flows: Flows, is_end: bool) -> dict[int, int]:
    """flow id -> the candidate event holding its start (or end) point on its thread."""
    ids = np.frombuffer(flows.id, dtype=np.int64)
    sel = np.frombuffer(flows.is_end, dtype=np.int8) == int(is_end)
    ftid = np.frombuffer(flows.tid, dtype=np.int64)[sel]
    fts = np.frombuffer(flows.ts, dtype=np.int64)[sel]
    fid = ids[sel]
    out: dict[int, int] = {}
    for t in np.unique(ftid).tolist():
        mine = candidates[tid[candidates] == t]
        mine = mine[np.argsort(start[mine], kind="stable")]
        here = ftid == t
        j = np.searchsorted(start[mine], fts[here], side="right") - 1
        ok = (j >= 0) & (end[mine[np.maximum(j, 0)]] >= fts[here])
        out.update(zip(fid[here][ok].tolist(), mine[j[ok]].tolist()))
    return out


def phases(rows: Walked, host: HostEvents, roles: np.ndarray, ann_labels: list[tuple[str, ...]],
           created: set[int], comm: dict[int, dict[str, Any]]) -> list[int]:
    """Each row's phase (see the module docstring); ``created``: rows that created an
    autograd node; ``comm``: the collectives' rows."""
    label_phase: list[Optional[int]] = [None] * len(ann_labels)
    for i, chain in enumerate(ann_labels):
        found = [p for p in (phase_of_label(label) for label in chain) if p is not None]
        label_phase[i] = found[-1] if found else None
    names = host.names.values
    out = []
    for r, e in enumerate(rows.event):
        labelled = label_phase[rows.ann[r]] if rows.ann[r] >= 0 else None
        b = rows.bwd[r]
        if b >= 0:
            phase = labelled if labelled in _OVERRIDE_BACKWARD else PHASE_BACKWARD
            if phase == PHASE_BACKWARD and r in comm and \
                    "AccumulateGrad" in names[host.name[b]]:
                phase = PHASE_GRAD_SYNC
        elif labelled is not None:
            phase = labelled
        elif rows.module[r] >= 0 or r in created or host.grad[e]:
            phase = PHASE_FORWARD
        else:
            phase = PHASE_OTHER
        out.append(phase)
    return out


def comm_rows(rows: Walked, host: HostEvents, roles: np.ndarray, groups: ProcessGroups,
              kernel_kind: dict[int, str]) -> dict[int, dict[str, Any]]:
    """row -> its collective: kind, group, bytes, dtype, peer (the columns of a recorded
    collective), from the c10d op and the record_param_comms and ranges inside it."""
    names = host.names.values
    found: dict[int, dict[str, Any]] = {}
    for r, e in enumerate(rows.event):
        name = names[host.name[e]]
        if name.startswith("c10d::") and kind_of_name(name):
            found[r] = {"op": name, "args": host.comm.get(e, {}), "kind": kind_of_name(name)}
    gloo_dtypes: dict[str, list[Any]] = {}
    for e, r in sorted(rows.owner.items()):
        args, name = host.comm.get(e, {}), names[host.name[e]]
        if roles[e] == COMM_ANN:
            if r < 0:           # gloo's ranges on its worker threads: the tensors' dtype
                gloo_dtypes.setdefault(name.split(":", 1)[1], []).append(
                    tensor_input(args)[1])
                continue
            entry = found.setdefault(r, {"op": names[host.name[rows.event[r]]], "args": {}})
            entry.setdefault("kind", kind_of_name(name))
            entry.setdefault("range_dtype", tensor_input(args)[1])
            continue
        entry = found.setdefault(r, {"op": names[host.name[rows.event[r]]], "args": {}})
        entry["rpc"] = args
        kind = kind_of_name(str(args.get("Collective name", "")))
        if kind:
            entry["kind"] = kind
    for r, entry in found.items():
        if not entry.get("kind"):
            entry["kind"] = kernel_kind.get(r)
    out = {r: _collective(e, groups) for r, e in sorted(found.items()) if e.get("kind")}
    _gloo_dtypes(out, gloo_dtypes)
    return out


def _collective(entry: dict[str, Any], groups: ProcessGroups) -> dict[str, Any]:
    rpc, args = entry.get("rpc") or {}, entry["args"]
    group = groups.of(rpc) if rpc else groups.of({})
    dtype, size = dtype_of(rpc.get("dtype"))
    nelems = rpc.get("In msg nelems")
    if type(nelems) is not int:
        nelems, kineto_dtype = tensor_input(args)
        if dtype is None:
            dtype, size = dtype_of(kineto_dtype or entry.get("range_dtype"))
    seq = rpc.get("Seq")
    return {"kind": entry["kind"], "group": group, "dtype": dtype, "size": size,
            "elements": nelems if type(nelems) is int and nelems >= 0 else None,
            "peer": peer_of(entry["op"], args, group),
            "seq": seq if type(seq) is int and 0 <= seq < 1 << 31 else None}


def _gloo_dtypes(found: dict[int, dict[str, Any]], gloo: dict[str, list[Any]]) -> None:
    """Collectives with no dtype take that of gloo's range of the same kind, k-th to k-th."""
    taken: dict[str, int] = {}
    for entry in found.values():
        kind = entry["kind"]
        k = taken.get(kind, 0)
        taken[kind] = k + 1
        seen = gloo.get(kind, [])
        if entry["dtype"] is None and k < len(seen) and seen[k]:
            entry["dtype"], entry["size"] = dtype_of(seen[k])


def stack_text(frames: tuple[list[Union[str, int]], ...]) -> str:
    return json.dumps([list(f) for f in reversed(frames)], separators=(",", ":"))


def annotation_text(labels: tuple[str, ...]) -> str:
    return json.dumps([{"label": label} for label in labels], separators=(",", ":"))

