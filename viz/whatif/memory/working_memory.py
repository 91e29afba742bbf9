"""The recorded step's *working* storages (what the model's ops made: activations and
temporaries), laid on a predicted step (viz.whatif.recorded.axis): the recorded data parallelism's
own buffers and gradients left out (viz.whatif.memory.memory_replay makes the target's), those of a
micro-batch copied with it, and scaled: by the micro-batch size where the batch makes them
(forward, backward, recompute, the data) and by the parameters' dtype under mixed precision
(forward, backward, recompute).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from tracer.vocab.model_paths import model_path

from ..edits.tp_plan import work_factor
from ..recorded.axis import Axis
from ..recorded.layout import Layout, itemsize
from ..recorded.setup import Setup
from ..recorded.windows import BACKWARD
from .memory_replay import Life

BATCH_PHASES = ("forward", "backward", "recompute", "other")
DTYPE_PHASES = ("forward", "backward", "recompute")


@dataclass(frozen=True)
class Work:
    """A working storage on the recorded step's clock; ``born_order`` / ``freed_order``
    place it among what happens at the same instant (a recomputation inserted before a
    backward)."""

    category: str
    nbytes: int
    start: Optional[int]
    end: Optional[int]
    phase: Optional[str]
    module: Optional[str] = None
    born_order: float = 0
    freed_order: float = 0


def gradient_storages(storages: list, rec: Setup, layout: Layout) -> dict:
    """Parameter name -> the recorded storage of its gradient made in the step's backward:
    under DDP its ``.grad``, under FSDP2 its unsharded gradient (a temporary), matched by
    module and size in the order they were made."""
    wanted = "gradients" if rec.shard not in ("gradients", "full") else "temporaries"
    dtype = rec.param_dtype if rec.shard in ("gradients", "full") else None
    pool: dict = {}
    for s in sorted((s for s in storages if s.category == wanted and s.start is not None
                     and s.phase == "backward" and s.module), key=lambda s: s.start):
        pool.setdefault((model_path(s.module), s.nbytes), []).append(s)
    out = {}
    for p in layout.trainable:
        found = pool.get((p.module, p.numel * itemsize(dtype or p.dtype)))
        if found:
            out[p.name] = found.pop(0)
    return out


def working(storages: list, rec: Setup, grads: dict) -> list:
    """The recorded storages that are the model's own work, as :class:`Work`."""
    owned = {id(s) for s in grads.values()}
    out = []
    for s in storages:
        if s.category in ("parameters", "gradients", "optimizer_state") or id(s) in owned:
            continue
        if s.phase == "optimizer":
            continue                     # the optimizer's: memory_replay scales them
        if rec.shard is not None and (s.category == "comm" or s.phase == "grad_sync"):
            continue                     # the recorded data parallelism's buffers
        out.append(Work(s.category, s.nbytes, s.start, s.end, s.phase, s.module))
    return out


def scaled(works: list, batch: float, dtype: float, plan=None) -> list:
    """Each work's bytes times the micro-batch ratio and the dtype ratio, where they apply
    (storages made before the step: the previous step's loss and outputs, batch-sized), and
    the share a TP rank keeps of it (viz.whatif.edits.tp_plan.work_factor)."""
    out = []
    for w in works:
        factor = work_factor(plan, w.module, w.phase)
        if w.phase in BATCH_PHASES or w.start is None:
            factor *= batch
        if w.phase in DTYPE_PHASES:
            factor *= dtype
        out.append(replace(w, nbytes=round(w.nbytes * factor)) if factor != 1.0 else w)
    return out


def dtensor_saved(works: list, plan, windows) -> list:
    """Under a TP plan, what a sharded linear alone saved for backward is saved as a DTensor,
    whose storage the recorder does not reach through the wrapper: such a storage (an
    activation freed inside the backward of a planned linear) stays a temporary."""
    if plan is None:
        return works
    runs = [r for module in plan.styles for r in windows.of(BACKWARD, module)]
    out = []
    for w in works:
        if w.category == "activations" and w.end is not None and \
                any(a <= w.end <= b for a, b in runs):
            w = replace(w, category="temporaries")
        out.append(w)
    return out


def on_axis(works: list, axis: Axis) -> list:
    """Each work as the predicted step's :class:`Life` s: one per copy of the micro-batch
    it was made in; none where its micro-batch is dropped."""
    out = []
    for w in works:
        if w.start is None:
            freed = _freed(axis, axis.first_micro(), w.end, w.freed_order, first=True)
            out.append(Life(w.category, w.nbytes, None, freed))
            continue
        for seg in axis.places(w.start):
            out.append(Life(w.category, w.nbytes, (seg, w.start, w.born_order),
                            _freed(axis, seg, w.end, w.freed_order)))
    return out


def _freed(axis: Axis, seg: int, end: Optional[int], order: int,
           first: bool = False) -> Optional[tuple]:
    """Where a storage made in segment ``seg`` is freed: in that segment where its window
    holds ``end``, else the first later segment that does, else at the next segment's
    start (its recorded free fell in a micro-batch the target drops)."""
    if end is None:
        return None
    places = axis.places(end)
    if first and places:
        return (places[0], end, order)
    if seg in places:
        return (seg, end, order)
    later = [p for p in places if p > seg]
    if later:
        return (later[0], end, order)
    if seg + 1 < len(axis.segments):
        return (seg + 1, axis.segments[seg + 1].lo, -10)
    return None


def dtype_ratio(rec: Setup, tgt: Setup, layout: Layout) -> float:
    """How much smaller the activations get under the target's parameter dtype."""
    params = layout.trainable
    if not params or rec.param_dtype == tgt.param_dtype:
        return 1.0
    own = itemsize(params[0].dtype)
    return itemsize(tgt.param_dtype or params[0].dtype) / itemsize(rec.param_dtype or
                                                                  params[0].dtype) \
        if own else 1.0
