"""Each rank's peak memory by category in a predicted step of any model, replayed from the
storages of the recorded step (recorded by default; viz.analysis.step_detail).

A step's memory is the recorded *working* storages (activations, temporaries: what the
model's ops made, at their recorded places on the predicted step's axis, viz.whatif.recorded.axis;
scaled with the micro-batch size and the parameters' dtype; moved by checkpointing,
viz.whatif.edits.checkpointing) plus the *model states* the target's sharding holds, made anew:

- parameters: every parameter whole (DDP, ZeRO-1) or its padded shard (FSDP2), and the
  buffers; FSDP2's unsharded parameters of a unit from its all-gather's copy-out to its
  reshard (after its forward, and after its backward; never before its backward's end under
  ZeRO-2, the root's never before the backward's end);
- gradients: each parameter's from the moment its gradient is ready in the (first)
  backward (where the recording's gradients were made, else its module's backward end) to
  the next step's ``zero_grad`` (as the recording's were freed); FSDP2's sharded gradients
  from each unit's reduce-scatter, and its unsharded ones, temporaries, until then;
- optimizer state: the recording's bytes per parameter element, on the elements a rank
  steps (ZeRO-1: its partition; FSDP2: its shards); the optimizer's temporaries scaled so;
- communication buffers: DDP's buckets (all the step), FSDP2's all-gather outputs (from
  the launch to the copy-out) and reduce-scatter inputs (temporaries, from the unit's
  backward end to the next reduce-scatter's).

The peak is the largest sum at any place, with what each category held there.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..recorded.axis import Axis
from ..recorded.layout import ROOT, Layout, itemsize, zero_partition
from ..recorded.setup import Setup

CATEGORIES = ("temporaries", "comm", "activations", "optimizer_state", "gradients",
              "parameters")
BEFORE, AFTER = (-1, -1, 0), (10 ** 9, 0, 0)


@dataclass(frozen=True)
class Life:
    """A storage of the predicted step: born and freed at positions (None: before the step
    began, after it ended)."""

    category: str
    nbytes: int
    born: Optional[tuple]
    freed: Optional[tuple]


def peak(lives: list) -> dict:
    """``{"peak_bytes", "by_category"}``: the largest total live at once, and by category."""
    events = []
    for life in lives:
        if life.nbytes <= 0:
            continue
        events.append((life.born or BEFORE, 1, life.category, life.nbytes))
        events.append((life.freed or AFTER, 0, life.category, -life.nbytes))
    events.sort(key=lambda e: (e[0], e[1]))
    live = dict.fromkeys(CATEGORIES, 0)
    best, at = 0, dict(live)
    for _, _, category, delta in events:
        live[category] = live.get(category, 0) + delta
        total = sum(live.values())
        if total > best:
            best, at = total, dict(live)
    return {"peak_bytes": int(best),
            "by_category": {c: int(b) for c, b in sorted(at.items(), key=lambda kv: -kv[1])}}


def held_elements(setup: Setup, layout: Layout, rank: int) -> int:
    """Parameter elements a rank's optimizer steps."""
    params = layout.trainable
    if setup.shard == "optimizer":
        return sum(p.numel for p in zero_partition(params, setup.dp)[rank % setup.dp])
    if setup.shard in ("gradients", "full"):
        return sum(p.local_shard(setup.dp, rank % setup.dp) for p in params)
    return sum(p.numel for p in params)


class StatesModel:
    """The recorded optimizer's bytes per element, and where the recording freed gradients."""

    def __init__(self, storages: list, rec: Setup, layout: Layout, rank: int):
        held = held_elements(rec, layout, rank) or 1
        state = sum(s.nbytes for s in storages if s.category == "optimizer_state")
        self.per_element = state / held
        temps = [s for s in storages if s.phase == "optimizer" and s.category == "temporaries"]
        self.optimizer_temps = temps
        self.held = held
        frees = [s.end for s in storages if s.category == "gradients" and s.start is None
                 and s.end is not None]
        self.zero_grad = min(frees) if frees else None


def states(tgt: Setup, layout: Layout, axis: Axis, model: StatesModel, rank: int,
           ready: dict, units: dict, planned: list) -> list:
    """The model states of a predicted rank: parameters, gradients, optimizer state and
    DP buffers (module doc). ``ready``: micro segment -> parameter name -> the position its
    gradient is ready; ``units``: micro segment -> unit -> (its parameters, forward run,
    backward run)."""
    lives = [Life("parameters", b.nbytes, None, None) for b in layout.buffers]
    params = layout.trainable
    zero = _zero_grad(axis, model)
    held = held_elements(tgt, layout, rank)
    lives.append(Life("optimizer_state", round(model.per_element * held), None, None))
    ratio = held / model.held if model.held else 1.0
    post = len(axis.segments) - 1
    for s in model.optimizer_temps:
        lives.append(Life("temporaries", round(s.nbytes * ratio), _pos(axis, s.start, post),
                          _pos(axis, s.end, post)))
    if tgt.shard in ("gradients", "full"):
        return lives + _fsdp_states(tgt, layout, axis, rank, ready, units, planned, zero)
    lives += [Life("parameters", p.nbytes, None, None) for p in params]
    first = ready.get(axis.first_micro(), {})
    for p in params:
        lives.append(Life("gradients", p.nbytes, None, zero))
        lives.append(Life("gradients", p.nbytes, first.get(p.name), None))
        for seg in axis.micro_segments[1:]:     # a later micro-batch's, added into .grad
            at = ready.get(seg, {}).get(p.name)
            if at is not None:
                lives.append(Life("temporaries", p.nbytes, at, _after(at, 1)))
    if tgt.shard in ("replicate", "optimizer"):
        buckets = [c for c in planned if c.kind == "all_reduce" and c.phase == "grad_sync"]
        lives += [Life("comm", c.nbytes, None, None) for c in buckets]
    return lives


def _zero_grad(axis: Axis, model: StatesModel) -> tuple:
    if model.zero_grad is None:
        return (0, axis.segments[0].lo, 0)
    return (axis.place(model.zero_grad) or 0, model.zero_grad, 0)


def _pos(axis: Axis, t: Optional[int], default: int) -> Optional[tuple]:
    if t is None:
        return None
    place = axis.place(t)
    return (place if place is not None else default, t, 0)


def _fsdp_states(tgt: Setup, layout: Layout, axis: Axis, rank: int, ready: dict,
                 units: dict, planned: list, zero: tuple) -> list:
    n = tgt.dp
    dtype = tgt.param_dtype
    lives = [Life("parameters", p.padded_shard(n) * itemsize(p.dtype), None, None)
             for p in layout.trainable]
    gathers = {(c.unit, c.launch[0], c.phase): c for c in planned if c.kind == "all_gather"}
    scatters = [c for c in planned if c.kind == "reduce_scatter"]
    first_seg = axis.first_micro()
    lives += _gather_buffers(planned, n, units)
    for seg, per_unit in units.items():
        for unit, (params, fwd, bwd) in per_unit.items():
            full = sum(p.numel * itemsize(dtype or p.dtype) for p in params)
            start = _after(gathers[(unit, seg, "forward")].wait, 1)
            if unit == ROOT or tgt.shard == "gradients":
                lives.append(Life("parameters", full, start, (seg, bwd[1], 9)))
            else:
                lives.append(Life("parameters", full, start, (seg, fwd[1], 5)))
                back = gathers.get((unit, seg, "backward"))
                lives.append(Life("parameters", full, _after(back.wait, 1), (seg, bwd[1], 9)))
    for c in scatters:
        params, _, _ = units[c.launch[0]][c.unit]
        lives.append(Life("temporaries", c.nbytes, c.launch, c.wait))
        here = ready.get(c.launch[0], {})
        for p in params:                 # unsharded gradients, until the copy-in
            grad = p.numel * itemsize(dtype or p.dtype)
            born = here.get(p.name) or _after(c.launch, -1)
            lives.append(Life("temporaries", grad, min(born, c.launch), c.launch))
        if c.launch[0] == first_seg:
            shard = sum(p.padded_shard(n) * itemsize(p.dtype) for p in params)
            lives.append(Life("gradients", shard, None, zero))
            lives.append(Life("gradients", shard, _after(c.launch, 1), None))
    return lives


def _gather_buffers(planned: list, n: int, units: dict) -> list:
    """FSDP2's all-gather outputs: in backward, from the launch to the copy-out; in forward
    (implicit prefetching) kept until the next unit's all-gather has been issued, the last
    one until the root's forward returns (FSDPParamGroup.wait_for_unshard)."""
    out = []
    forward: dict = {}
    for c in planned:
        if c.kind != "all_gather":
            continue
        if c.phase == "backward":
            out.append(Life("comm", c.nbytes * n, c.launch, _after(c.wait, 3)))
        else:
            forward.setdefault(c.launch[0], []).append(c)
    for seg, gathers in forward.items():
        end = max((fwd[1] for _, fwd, _ in units[seg].values()), default=gathers[-1].wait[1])
        for c, after in zip(gathers, gathers[1:] + [None]):
            freed = after.launch[:2] + (-2,) if after is not None else (seg, end, 6)
            out.append(Life("comm", c.nbytes * n, c.launch, freed))
    return out


def _after(position: tuple, by: int) -> tuple:
    return position[:2] + (position[2] + by,)
