"""A predicted step's program, edited from the recorded one: the source rank's program as its
replay ran it (viz.whatif.replay.graph, viz.whatif.replay.simulate), cut into the predicted step's
segments (viz.whatif.recorded.axis: a micro-batch copied or dropped), with

- the recorded data parallelism's collectives taken out and the target's put in at their
  positions (viz.whatif.edits.dp_plan), their transfer from the collective model fitted on the
  recording (viz.whatif.replay.models);
- a checkpointed module's forward compute inserted before its backward (its recomputation);
  a module no longer checkpointed: recomputation taken out;
- the micro-batches' compute scaled to another micro-batch size: each op's time by the
  op-cost model at its work times the size ratio, the host time between ops unchanged;
- everything else (compute, host time, the other communications) as recorded.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..recorded.axis import Axis
from ..recorded.windows import BACKWARD, FORWARD, RECOMPUTE, StepWindows
from ..replay.compose import Call, Programs
from ..replay.graph import COMPUTE, IDLE, LAUNCH, STEP, WAIT
from ..replay.models import work_of
from .checkpointing import RECOMPUTED
from .dp_plan import is_dp_comm
from .tp_plan import work_factor


@dataclass
class Item:
    """One thing of a predicted step at its position: compute or idle (``value`` ns), or a
    communication's launch or wait (``call``, ``key`` tying the two)."""

    position: tuple
    op: int
    value: float = 0.0
    call: Optional[Call] = None
    key: Optional[tuple] = None


def timed_nodes(program: list, done: dict, rank: int, start: int) -> dict:
    """step -> [(time, op, value)] of a program as its replay ran it."""
    out: dict = {}
    t, step = start, None
    for op, value in program:
        if op == STEP:
            step = value
            out[step] = []
            continue
        if step is None:
            continue
        out[step].append((t, op, value))
        if op in (COMPUTE, IDLE):
            t += value
        elif op == WAIT:
            t = max(t, done.get(value, {}).get(rank, t))
    return out


def _segments(axis: Axis, t: int) -> list:
    found = axis.places(t)
    if found:
        return found
    place = axis.place(t)
    return [] if place is None else [place]


def _pieces(t: int, ns: int, cuts: list) -> list:
    """(start, length) of compute [t, t + ns) cut at ``cuts`` (sorted)."""
    out, lo = [], t
    for c in cuts:
        if lo < c < t + ns:
            out.append((lo, c - lo))
            lo = c
    out.append((lo, t + ns - lo))
    return out


class StepEdit:
    """The items of one predicted step of one rank."""

    def __init__(self, axis: Axis, windows: StepWindows, dp_owned: dict, planned: list,
                 transfer, source: int, regroup):
        self.axis, self.windows = axis, windows
        self.dp_owned, self.planned = dp_owned, planned    # comm index -> comm id
        self.owned = set(dp_owned.values())
        self.transfer = transfer                     # (kind, group, bytes) -> ns
        self.source = source                         # the recorded rank it copies
        self.regroup = regroup                       # a recorded group -> the target's
        self.inserts: list = []                      # (position, ns)
        self.drops: list = []                        # windows whose compute is taken out
        self.scaled: list = []                       # (lo, hi, factor) of compute

    def cuts(self) -> list:
        """The recorded times compute is cut at: where something is put in, taken out or
        scaled, and where segments start."""
        times = {p.launch[1] for p in self.planned} | {p.wait[1] for p in self.planned}
        times |= {pos[1] for pos, _ in self.inserts}
        for lo, hi in self.drops:
            times |= {lo, hi}
        for lo, hi, _ in self.scaled:
            times |= {lo, hi}
        times |= {s.lo for s in self.axis.segments}
        return sorted(times)

    def items(self, nodes: list, graph) -> list:
        """The predicted step's items, in order: the recorded ``nodes`` (timed, of the
        recorded ``graph``) cut, copied, dropped and scaled, the recorded data parallelism's
        collectives out, the planned ones and the inserted compute in."""
        out: list = []
        cuts = self.cuts()
        for t, op, value in nodes:
            if op in (LAUNCH, WAIT):
                if value in self.owned:
                    continue
                for seg in _segments(self.axis, t):
                    out.append(self._recorded(seg, t, op, value, graph))
                continue
            if op == IDLE:
                for seg in _segments(self.axis, t):
                    out.append(Item((seg, t, 0), IDLE, value))
                continue
            for lo, ns in _pieces(t, value, cuts):
                if any(a <= lo < b for a, b in self.drops):
                    continue
                factor = next((f for a, b, f in self.scaled if a <= lo < b), 1.0)
                for seg in _segments(self.axis, lo):
                    out.append(Item((seg, lo, 0), COMPUTE, ns * factor))
        waits = {value: t for t, op, value in nodes if op == WAIT}
        for p in self.planned:
            cid = self.dp_owned.get(p.recorded) if p.recorded is not None else None
            ns = graph.comms[cid].transfer.get(self.source) if cid is not None else None
            call = Call(p.kind, p.group, p.nbytes,
                        ns if ns is not None else self.transfer(p.kind, p.group, p.nbytes),
                        p.role)
            key = ("planned", id(p))
            wait = p.wait
            if cid is not None and cid in waits:      # where the recording waited for it
                wait = (p.launch[0], waits[cid], 1)
            out.append(Item(p.launch, LAUNCH, call=call, key=key))
            out.append(Item(max(wait, p.launch[:2] + (p.launch[2] + 0.5,)), WAIT, key=key))
        for position, ns in self.inserts:
            out.append(Item(position, COMPUTE, ns))
        return sorted(out, key=lambda i: i.position)

    def _recorded(self, seg: int, t: int, op: int, cid: int, graph) -> Item:
        comm = graph.comms[cid]
        key = ("recorded", cid, seg)
        if op == WAIT:
            return Item((seg, t, 0), WAIT, key=key)
        ns = comm.transfer.get(self.source, max(comm.transfer.values(), default=0))
        call = Call(comm.kind_on(self.source), self.regroup(comm.group), comm.nbytes, ns,
                    comm.role or "recorded")
        return Item((seg, t, 0), LAUNCH, call=call, key=key)


def dp_owned(nodes: list, comms: list, rec) -> dict:
    """The recorded data parallelism's own collectives in a step: index among the step's
    recorded communications -> comm id (the k-th launch of the step is the k-th recorded
    communication: both in launch order)."""
    launched = [v for _, op, v in nodes if op == LAUNCH]
    return {i: cid for i, (cid, comm) in enumerate(zip(launched, comms))
            if is_dp_comm(comm, rec)}


def compute_in(nodes: list, lo: int, hi: int) -> float:
    """Compute of ``nodes`` inside [lo, hi]."""
    total = 0.0
    for t, op, value in nodes:
        if op == COMPUTE:
            total += max(min(t + value, hi) - max(t, lo), 0)
    return total


def checkpoint_edits(edit: StepEdit, nodes: list, recorded: tuple, target: tuple) -> None:
    """Insert the recomputation of each newly checkpointed module (its forward's compute,
    before its backward), take out that of each module no longer checkpointed."""
    windows, axis = edit.windows, edit.axis
    for module in target:
        if module in recorded:
            continue
        for fwd in windows.of(FORWARD, module):
            after = next((b for b in windows.of(BACKWARD, module) if b[0] > fwd[1]), None)
            if after is None:
                continue
            ns = compute_in(nodes, fwd[0], fwd[1])
            for seg in axis.places(after[0]):
                edit.inserts.append(((seg, after[0], RECOMPUTED), ns))
    for module in recorded:
        if module not in target:
            edit.drops += windows.of(RECOMPUTE, module)


def micro_scale(ops, windows: StepWindows, nodes: list, cost, ratio: float, plan,
                step: int) -> list:
    """(lo, hi, factor) of each recorded micro-batch whose compute takes ``ratio`` times the
    micro-batch size and the TP ``plan`` (None: none): each forward, backward and recompute
    op's time by the op-cost model at its work times ``ratio``, and by the share of it a TP
    rank keeps (viz.whatif.edits.tp_plan.work_factor); spread over the micro-batch's compute (host
    time between ops stays)."""
    if ratio == 1.0 and plan is None:
        return []
    out = []
    mine = ops.step == step
    phases = {FORWARD: "forward", BACKWARD: "backward", RECOMPUTE: "recompute"}
    for micro in windows.micro:
        lo, hi = micro.forward[0], micro.backward[1]
        inside = mine & (ops.t0 >= lo) & (ops.t0 <= hi)
        extra = 0.0
        for i in inside.nonzero()[0].tolist():
            phase = phases.get(int(ops.phase[i]))
            if phase is None:
                continue
            name = ops.names[ops.op[i]]
            shapes = ops.shape_texts[ops.shapes[i]] if ops.shapes[i] >= 0 else None
            work = work_of(name, shapes)
            module = ops.modules[ops.module[i]] if ops.module[i] >= 0 else None
            new = cost.ratio(name, work, work * ratio) * work_factor(plan, module, phase)
            extra += float(ops.t1[i] - ops.t0[i]) * (new - 1.0)
        total = compute_in(nodes, lo, hi)
        out.append((lo, hi + 1, max(1.0 + extra / total, 0.0) if total > 0 else 1.0))
    return out


def emit(programs: Programs, rank: int, step: int, items: list) -> None:
    """Append one predicted step's items to ``rank``'s program."""
    programs.step(rank, step)
    cids: dict = {}
    for item in items:
        if item.op in (COMPUTE, IDLE):
            programs.compute(rank, item.value, idle=item.op == IDLE)
        elif item.op == LAUNCH:
            cids[item.key] = programs.launch(rank, item.call)
        elif item.key in cids:
            programs.wait(rank, cids[item.key])
