"""The data-parallel collectives of a predicted step, each anchored to the recorded step
(viz.whatif.recorded.axis positions), as DDP, ZeroRedundancyOptimizer and FSDP2 issue them:

- DDP (``replicate``): the buffers' broadcast at the start of the forward that synchronises
  (one per dtype; under ``no_sync`` only the last micro-batch's) and the gradient buckets'
  all-reduces in its backward, each launched once its last gradient is ready and waited at the
  backward's end. A recording of DDP lends its own (same buckets, same places); else the buckets
  come from torch's assignment (viz.whatif.recorded.layout.ddp_buckets) over the parameters in the
  order their modules' backward ended.
- ZeRO-1 (``optimizer``): DDP's, and after the optimizer step a broadcast of every parameter
  from the rank that owns it (ZeroRedundancyOptimizer._sync_params), owners' lists in order,
  one after the other (issued at once, they run in turn on the group's backend).
- FSDP2 (``full``): each micro-batch, an all-gather per unit at its forward's start (the root
  first), waited at once; in backward, each unit's all-gather launched at the start of the
  unit whose backward runs before it (FSDP2's implicit prefetch; the root's for the first)
  and waited at its own start; a reduce-scatter per unit at the end of its backward (the
  root's at the backward's end), waited at the next one's launch. ZeRO-2 (``gradients``,
  ``reshard_after_forward=False``) has no backward all-gathers. An all-gather hands in the
  rank's padded shard, a reduce-scatter N of them, in mixed precision's param_dtype.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from tracer.vocab.model_paths import unwrap

from ..recorded.axis import Axis
from ..recorded.layout import ROOT, Layout, ddp_buckets, fsdp_bytes, zero_partition
from ..recorded.setup import Setup
from ..recorded.windows import BACKWARD, FORWARD, StepWindows

DP_KINDS = ("all_reduce", "broadcast", "all_gather", "reduce_scatter")


@dataclass
class Planned:
    """A communication of the predicted step: positions ``(segment, t, order)``."""

    kind: str
    phase: str
    group: tuple
    nbytes: int
    launch: tuple
    wait: tuple
    role: str = "dp"
    unit: Optional[str] = None
    recorded: Optional[int] = None      # the index of the recorded communication it repeats


def is_dp_comm(comm, rec: Setup) -> bool:
    """Whether a recorded communication is the recorded data parallelism's own (replaced by
    the target's)."""
    if rec.shard is None or comm.group != rec.dp_group or comm.kind not in DP_KINDS:
        return False
    wrappers = unwrap(comm.module).wrappers if comm.module else ()
    if rec.shard in ("replicate", "optimizer"):
        return "DDP" in wrappers or (rec.shard == "optimizer" and comm.kind == "broadcast"
                                     and comm.phase == "optimizer")
    return comm.kind in ("all_gather", "reduce_scatter") and comm.module is not None


def plan_dp(rec: Setup, tgt: Setup, layout: Layout, windows: StepWindows, axis: Axis,
            comms: list, rank: int) -> list:
    """The data-parallel communications of one predicted rank's step (``comms``: the source
    rank's recorded ones of the step; ``layout``: the parameters one rank holds, a TP
    target's local ones)."""
    if tgt.shard is None:
        return []
    group = dp_group(tgt, rank)
    out: list = []
    if tgt.shard in ("replicate", "optimizer"):
        out += _ddp(rec, tgt, layout, windows, axis, comms, group)
        if tgt.shard == "optimizer":
            out += _zero_broadcasts(layout, windows, axis, group)
    else:
        out += _fsdp(tgt, layout, windows, axis, group)
    return out


def dp_group(tgt: Setup, rank: int) -> tuple:
    """The data-parallel group of ``rank`` in a (dp, tp) grid: the ranks with its TP index."""
    return tuple(rank % tgt.tp + i * tgt.tp for i in range(tgt.dp))


def _end(axis: Axis, segment: int) -> tuple:
    """The position of a micro-batch's autograd end (DDP's finalize waits there)."""
    source = axis.source(segment)
    micro = axis.windows.micro[source if source is not None else -1]
    return (segment, micro.autograd_end, 90)


def _ddp(rec: Setup, tgt: Setup, layout: Layout, windows: StepWindows, axis: Axis,
         comms: list, group: tuple) -> list:
    last = axis.last_micro()
    out = []
    if rec.shard in ("replicate", "optimizer") and tgt.tp == rec.tp:
        for index, c in enumerate(comms):
            if not is_dp_comm(c, rec) or c.phase == "optimizer":
                continue
            if axis.place(c.t0, axis.segments[last].micro) != last and not axis.same:
                continue            # a micro-batch the target drops, or one outside them
            seg = axis.place(c.t0) if axis.same else last
            wait = (seg, c.t0, 1) if c.kind == "broadcast" else _end(axis, seg)
            out.append(Planned(c.kind, c.phase, group, c.nbytes, (seg, c.t0, 0), wait,
                               recorded=index if len(group) == len(rec.dp_group) else None))
        return out
    micro = windows.micro[axis.source(last)]
    for dtype, nbytes in _buffer_groups(layout):
        out.append(Planned("broadcast", "forward", group, nbytes, (last, micro.forward[0], -2),
                           (last, micro.forward[0], -1)))
    ready = _ready_order(layout, windows, micro)
    done = 0
    for size in ddp_buckets([p for p, _ in ready]):
        total, at = 0, micro.backward[0]
        while total < size and done < len(ready):
            total += ready[done][0].nbytes
            at = ready[done][1]
            done += 1
        out.append(Planned("all_reduce", "grad_sync", group, size, (last, at, 5),
                           _end(axis, last)))
    return out


def _buffer_groups(layout: Layout) -> list:
    """(dtype, bytes) of each broadcast DDP makes of the buffers (one per dtype)."""
    out: dict = {}
    for b in layout.buffers:
        out[b.dtype] = out.get(b.dtype, 0) + b.nbytes
    return list(out.items())


def _ready_order(layout: Layout, windows: StepWindows, micro) -> list:
    """(parameter, when its gradient is ready): the end of its module's backward run in the
    micro-batch, latest-registered first among equals."""
    out = []
    for index, p in enumerate(layout.trainable):
        run = _run(windows, BACKWARD, p.module, micro.backward)
        out.append((p, run[1] if run else micro.backward[1], -index))
    out.sort(key=lambda e: (e[1], e[2]))
    return [(p, t) for p, t, _ in out]


def _run(windows: StepWindows, phase: int, module: str, bounds: tuple) -> Optional[tuple]:
    runs = [r for r in windows.of(phase, module) if bounds[0] <= r[0] <= bounds[1]]
    if not runs:
        return None
    return (runs[0][0], runs[-1][1])


def _zero_broadcasts(layout: Layout, windows: StepWindows, axis: Axis, group: tuple) -> list:
    post = len(axis.segments) - 1
    at = windows.optimizer[1] if windows.optimizer else axis.segments[post].lo
    out = []
    for owned in zero_partition(layout.trainable, len(group)):
        for p in owned:
            # one after the other, as the group's backend runs them (gloo: one thread)
            k = 2 * len(out)
            out.append(Planned("broadcast", "optimizer", group, p.nbytes, (post, at, k),
                               (post, at, k + 1)))
    return out


def fsdp_units(tgt: Setup, layout: Layout, windows: StepWindows, micro) -> list:
    """(unit, its parameters, forward run, backward run) of the units holding parameters, in
    forward order (the root first, spanning the micro-batch)."""
    params = layout.unit_params(list(tgt.units))
    out = []
    for unit, mine in params.items():
        if unit == ROOT:
            span = windows.modules_span(FORWARD, micro.forward) or micro.forward
            out.append((unit, mine, (micro.forward[0], span[1]), micro.backward))
            continue
        fwd = _run(windows, FORWARD, unit, micro.forward)
        bwd = _run(windows, BACKWARD, unit, micro.backward)
        if fwd is not None and bwd is not None:
            out.append((unit, mine, fwd, bwd))
    return sorted(out, key=lambda u: (u[0] != ROOT, u[2][0]))


def _fsdp(tgt: Setup, layout: Layout, windows: StepWindows, axis: Axis, group: tuple) -> list:
    n = len(group)
    out = []
    for seg in axis.micro_segments:
        micro = windows.micro[axis.source(seg)]
        units = fsdp_units(tgt, layout, windows, micro)
        for unit, params, fwd, _ in units:
            nbytes = fsdp_bytes(params, n, tgt.param_dtype)
            out.append(Planned("all_gather", "forward", group, nbytes, (seg, fwd[0], -5),
                               (seg, fwd[0], -4), unit=unit))
        backward = sorted(units, key=lambda u: (u[0] != ROOT, u[3][0]))
        previous = micro.backward[0]
        if tgt.shard == "full":
            for unit, params, _, bwd in backward[1:]:
                out.append(Planned("all_gather", "backward", group,
                                   fsdp_bytes(params, n, tgt.param_dtype),
                                   (seg, previous, -4), (seg, bwd[0], -6), unit=unit))
                previous = bwd[0]
        reduces = [(bwd[1] if unit != ROOT else micro.backward[1], unit, params)
                   for unit, params, _, bwd in units]
        reduces.sort(key=lambda r: (r[1] == ROOT, r[0]))
        for i, (at, unit, params) in enumerate(reduces):
            wait = reduces[i + 1][0] if i + 1 < len(reduces) else micro.backward[1]
            out.append(Planned("reduce_scatter", "grad_sync", group,
                               n * fsdp_bytes(params, n, tgt.param_dtype), (seg, at, 10),
                               (seg, wait, 11 if i + 1 < len(reduces) else 95), unit=unit))
    return out
