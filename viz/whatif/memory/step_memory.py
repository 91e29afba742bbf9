"""A predicted rank's peak memory by category (viz.whatif.memory.memory_replay), from the recorded
step's storages of the rank it takes its work from: the working storages moved and scaled
(viz.whatif.memory.working_memory, viz.whatif.edits.checkpointing) plus the target's model
states."""
from __future__ import annotations

from typing import Optional

from ..edits.checkpointing import recheckpoint
from ..edits.dp_plan import fsdp_units
from ..edits.tp_plan import local_layout
from ..recorded.axis import Axis
from ..recorded.layout import Layout
from ..recorded.setup import Setup
from ..recorded.windows import BACKWARD, StepWindows
from .memory_replay import StatesModel, peak, states
from .working_memory import (dtensor_saved, dtype_ratio, gradient_storages, on_axis, scaled,
                             working)


def step_memory(rec: Setup, tgt: Setup, layout: Layout, detail, windows: StepWindows,
                axis: Axis, planned: list, rank: int) -> Optional[dict]:
    """``{"peak_bytes", "by_category"}`` of predicted rank ``rank`` whose work is
    ``detail``'s (a viz.analysis.step_detail.RankStepDetail of the memory step), or None
    when that step's memory was not recorded."""
    if not detail.storages:
        return None
    grads = gradient_storages(detail.storages, rec, layout)
    works = working(detail.storages, rec, grads)
    works = recheckpoint(works, rec.checkpointed, tgt.checkpointed, windows, detail.ops)
    works = dtensor_saved(works, tgt.tp_plan, windows)
    batch = (tgt.microbatch_size / rec.microbatch_size) \
        if tgt.microbatch_size and rec.microbatch_size else 1.0
    lives = on_axis(scaled(works, batch, dtype_ratio(rec, tgt, layout), tgt.tp_plan), axis)
    model = StatesModel(detail.storages, rec, layout, detail.rank)
    local = local_layout(layout, tgt.tp_plan)          # what one TP rank holds
    ready = {seg: _ready(local, windows, axis, seg, grads) for seg in axis.micro_segments}
    units = {}
    if tgt.shard in ("gradients", "full"):
        for seg in axis.micro_segments:
            micro = windows.micro[axis.source(seg)]
            units[seg] = {u: (params, fwd, bwd)
                          for u, params, fwd, bwd in fsdp_units(tgt, local, windows, micro)}
    lives += states(tgt, local, axis, model, rank, ready, units, planned)
    return peak(lives)


def _ready(layout: Layout, windows: StepWindows, axis: Axis, seg: int, grads: dict) -> dict:
    """Parameter name -> the position in segment ``seg`` where its gradient is ready: where
    the recording made it in that micro-batch, else its module's backward end there."""
    micro = windows.micro[axis.source(seg)]
    lo, hi = micro.forward[0], micro.backward[1]
    out = {}
    for p in layout.trainable:
        made = grads.get(p.name)
        if made is not None and lo <= made.start <= hi:
            out[p.name] = (seg, made.start, 0)
            continue
        runs = [r for r in windows.of(BACKWARD, p.module) if lo <= r[0] <= hi]
        out[p.name] = (seg, runs[-1][1] if runs else micro.backward[1], 0)
    return out
