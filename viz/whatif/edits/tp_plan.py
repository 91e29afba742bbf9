"""Tensor parallelism on any model: a torchtitan-style plan (module PATTERN -> ``colwise`` or
``rowwise``, torch's ColwiseParallel and RowwiseParallel with their default layouts: a
replicated input, the column-parallel output sharded on its last dimension and handed on as a
local tensor, the row-parallel output all-reduced), checked against the model's parameters,
and what it changes:

- parameters: a column-parallel linear keeps 1/N of its weight's rows and of its bias, a
  row-parallel one 1/N of its weight's columns and all its bias;
- communications, per micro-batch, over the TP group: a row-parallel linear all-reduces its
  output in forward (and again in a checkpointed module's recomputation), a column-parallel
  one its input's gradient in backward (``DTensor.from_local``'s backward turns the Partial
  gradient Replicate), each of the activation's bytes;
- compute: the matched linears' by N.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Optional

import numpy as np

from tracer.vocab.model_paths import matches, model_path

from ...analysis.callgraphs.flops import base_name, parse_shapes
from ..recorded.layout import Layout, itemsize
from ..recorded.windows import BACKWARD, FORWARD, RECOMPUTE
from ..reference_gpt.targets import TargetError
from .checkpointing import replayed
from .dp_plan import Planned

STYLES = ("colwise", "rowwise")
LINEAR_OPS = ("mm", "addmm", "linear", "matmul", "bmm")


@dataclass(frozen=True)
class TPPlan:
    """The modules a plan shards over ``tp`` ranks: path -> colwise | rowwise."""

    tp: int
    styles: dict

    def style_of(self, module: str) -> Optional[str]:
        return self.styles.get(module)

    def regions(self) -> list:
        """The modules holding both a column- and a row-parallel linear (attention, an MLP):
        what runs between them works on the local shard."""
        parents: dict = {}
        for module, style in self.styles.items():
            parents.setdefault(module.rpartition(".")[0], set()).add(style)
        return sorted(p for p, found in parents.items() if found == set(STYLES))

    def local_numel(self, param) -> int:
        """Elements of ``param`` a TP rank holds under the plan."""
        style = self.styles.get(param.module)
        if style is None or param.name.rpartition(".")[2] not in ("weight", "bias"):
            return param.numel
        if style == "colwise" or param.name.endswith(".weight"):
            return param.numel // self.tp
        return param.numel


def tp_plan(plan: dict, tp: int, layout: Layout, modules: list) -> TPPlan:
    """The plan's modules and styles; TargetError (one line) for a pattern matching no module,
    a style it does not know, a module that is no linear layer, a size N does not divide."""
    if tp < 1:
        raise TargetError(f"--tp must be >= 1, got {tp}")
    weights = {p.module: p for p in layout.params if p.name.endswith(".weight")}
    styles: dict = {}
    for pattern, style in plan.items():
        if style not in STYLES:
            raise TargetError(f"--tp-plan: {pattern!r} -> {style!r}: the styles are colwise "
                              "and rowwise")
        hits = [m for m in modules if m and matches(pattern, m)]
        if not hits:
            raise TargetError(f"--tp-plan: {pattern!r} matches no module of the model")
        for module in hits:
            weight = weights.get(module)
            if weight is None or len(weight.shape) != 2:
                raise TargetError(f"--tp-plan: {module} is not a linear layer (its weight is "
                                  f"{'missing' if weight is None else list(weight.shape)})")
            size = weight.shape[0] if style == "colwise" else weight.shape[1]
            if size % tp:
                raise TargetError(f"--tp {tp} does not divide {module}'s "
                                  f"{'output' if style == 'colwise' else 'input'} features "
                                  f"({size})")
            styles[module] = style
    return TPPlan(tp, styles)


def linear_bytes(ops, rows: np.ndarray, module: str, weight) -> Optional[tuple]:
    """(input bytes, output bytes) of one call of linear ``module`` in the forward ops
    ``rows`` (step detail): from its matmul's input (mm's first argument, addmm's second:
    the activation, rows of ``in_features``)."""
    out_features, in_features = weight.shape
    size = itemsize(weight.dtype)
    for i in rows.tolist():
        if ops.module[i] < 0 or model_path(ops.modules[ops.module[i]]) != module:
            continue
        name = base_name(ops.names[ops.op[i]])
        if name not in LINEAR_OPS or ops.shapes[i] < 0:
            continue
        args = parse_shapes(ops.shape_texts[ops.shapes[i]])
        activation = args[1] if name == "addmm" and len(args) > 1 else args[0] if args else None
        if isinstance(activation, tuple) and activation and activation[-1] == in_features:
            tokens = math.prod(activation) // in_features
            return tokens * in_features * size, tokens * out_features * size
    return None


def local_layout(layout: Layout, plan: Optional[TPPlan]) -> Layout:
    """The parameters one TP rank holds: each sharded one with its local shape (the first
    dimension split for a column-parallel linear, the second for a row-parallel weight)."""
    if plan is None:
        return layout
    params = []
    for p in layout.params:
        style, leaf = plan.style_of(p.module), p.name.rpartition(".")[2]
        shape = list(p.shape)
        if style == "colwise" and leaf in ("weight", "bias"):
            shape[0] //= plan.tp
        elif style == "rowwise" and leaf == "weight":
            shape[1] //= plan.tp
        params.append(replace(p, shape=tuple(shape)))
    return Layout(params, list(layout.buffers))


def tp_group(rank: int, tp: int) -> tuple:
    first = (rank // tp) * tp
    return tuple(range(first, first + tp))


def under(module: Optional[str], paths) -> bool:
    return module is not None and any(module == p or module.startswith(p + ".")
                                      for p in paths)


def work_factor(plan: Optional[TPPlan], module: Optional[str], phase: Optional[str]) -> float:
    """What of a storage (or an op's time) one TP rank keeps: 1/N where it works on a shard:
    a column-parallel linear's forward, a row-parallel one's backward, and all that runs
    directly in a module between them (attention's core, an MLP's activation)."""
    if plan is None or module is None:
        return 1.0
    module = model_path(module)
    cols = [m for m, s in plan.styles.items() if s == "colwise"]
    rows = [m for m, s in plan.styles.items() if s == "rowwise"]
    if phase in ("forward", "recompute") and under(module, cols):
        return 1.0 / plan.tp
    if phase == "backward" and under(module, rows):
        return 1.0 / plan.tp
    if phase in ("forward", "recompute", "backward") and module in plan.regions():
        return 1.0 / plan.tp
    return 1.0


def plan_tp(tgt, layout: Layout, windows, axis, ops, step: int, rank: int,
            batch: float = 1.0) -> list:
    """The TP all-reduces of one predicted step of ``rank`` (module doc), anchored to the
    recorded step: a row-parallel linear's at the end of its forward (and of its
    recomputation), a column-parallel one's at the end of its backward; each blocking. Their
    bytes: the recorded activation's, times ``batch`` (the micro-batch size ratio)."""
    plan = tgt.tp_plan
    if plan is None:
        return []
    weights = {p.module: p for p in layout.params if p.name.endswith(".weight")}
    group = tp_group(rank, plan.tp)
    mine = np.nonzero(ops.step == step)[0]
    out = []
    for seg in axis.micro_segments:
        micro = windows.micro[axis.source(seg)]
        rows = mine[(ops.t0[mine] >= micro.forward[0]) & (ops.t0[mine] <= micro.forward[1])]
        for module, style in sorted(plan.styles.items()):
            fwd = _run(windows, FORWARD, module, micro.forward)
            bwd = _run(windows, BACKWARD, module, micro.backward)
            sizes = linear_bytes(ops, rows, module, weights[module]) if fwd else None
            if sizes is None or bwd is None:
                continue
            nbytes = round((sizes[1] if style == "rowwise" else sizes[0]) * batch)
            if style == "colwise":
                out.append(Planned("all_reduce", "backward", group, nbytes,
                                   (seg, bwd[1], 1), (seg, bwd[1], 2), "tp", module))
                continue
            out.append(Planned("all_reduce", "forward", group, nbytes, (seg, fwd[1], 1),
                               (seg, fwd[1], 2), "tp", module))
            again = _recomputed(tgt, windows, module, micro, fwd)
            if again is not None:
                out.append(Planned("all_reduce", "recompute", group, nbytes, (seg,) + again,
                                   (seg, again[0], again[1] + 1e-6), "tp", module))
    return out


def _run(windows, phase: int, module: str, bounds: tuple) -> Optional[tuple]:
    runs = [r for r in windows.of(phase, module) if bounds[0] <= r[0] <= bounds[1]]
    return (runs[0][0], runs[-1][1]) if runs else None


def _recomputed(tgt, windows, module: str, micro, fwd: tuple) -> Optional[tuple]:
    """(time, order) where a checkpointed module's recomputation reaches the end of
    ``module``'s forward again: in the recorded recomputation, or in the one inserted
    before the checkpointed module's backward (viz.whatif.edits.checkpointing)."""
    outer = next((c for c in tgt.checkpointed if under(module, [c])), None)
    if outer is None:
        return None
    again = _run(windows, RECOMPUTE, module, micro.backward)
    if again is not None:
        return again[1], 1
    span = _run(windows, FORWARD, outer, micro.forward)
    after = _run(windows, BACKWARD, outer, micro.backward)
    if span is None or after is None:
        return None
    return after[0], replayed(fwd[1], span)
