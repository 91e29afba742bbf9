"""The parallel setup of any recorded run, read from the recording itself (the collectives,
phases and modules of its counted steps, viz.analysis.step_detail), not from a config only
the reference GPT writes:

- the data-parallel group and how it was used: DDP (``replicate``: gradient all-reduces on the
  DistributedDataParallel module), ZeRO-1 (``optimizer``: DDP and a broadcast of every
  parameter in the optimizer step, ZeroRedundancyOptimizer's), FSDP2 (``full``: all-gathers
  in forward and again in backward, reduce-scatters; ``gradients``, ZeRO-2, when it gathers
  only in forward), its units (the modules its all-gathers serve) and mixed precision (its
  all-gathers' bytes against the parameters');
- the modules checkpointing recomputed (the ``recompute`` phase: a checkpoint_wrapper's
  module, else each recomputation's common module);
- the micro-batches a step runs (forward passes separated by backward ones) and their size
  (the leading dimension most forward activations share).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Optional

import numpy as np

from tracer.vocab.labels import PHASES
from tracer.vocab.model_paths import model_path, unwrap

from ...analysis.callgraphs.flops import parse_shapes
from .layout import ROOT, Layout, fsdp_bytes, itemsize

SHARDINGS = ("replicate", "optimizer", "gradients", "full")
_FORWARD, _BACKWARD = PHASES.index("forward"), PHASES.index("backward")
_RECOMPUTE = PHASES.index("recompute")


@dataclass
class Setup:
    """How a run (recorded or predicted) is laid out, as far as these predictions go."""

    world: int
    dp: int = 1
    shard: Optional[str] = None          # SHARDINGS, or None: no data parallelism seen
    units: tuple = ()                    # FSDP2's, forward order, the root last
    param_dtype: Optional[str] = None    # FSDP2's mixed precision
    checkpointed: tuple = ()             # module paths
    microbatches: int = 1                # forward passes per step
    microbatch_size: Optional[int] = None
    dp_group: tuple = ()
    tp: int = 1
    tp_plan: Optional[object] = None     # viz.whatif.edits.tp_plan.TPPlan
    pp: int = 1
    schedule: Optional[str] = None       # a pipeline's: gpipe, 1f1b, interleaved
    # viz.whatif.pipeline.pp_stages.StageCut of a predicted split
    stages: Optional[object] = None

    def config(self) -> dict:
        """whatif.json's ``config`` keys of this setup."""
        out = {"world": self.world, "dp": self.dp, "shard": self.shard,
               "shard_units": list(self.units), "param_dtype": self.param_dtype,
               "checkpoint": list(self.checkpointed), "grad_accum": self.microbatches,
               "microbatch_size": self.microbatch_size, "tp": self.tp,
               "tp_plan": dict(self.tp_plan.styles) if self.tp_plan is not None else None}
        if self.pp > 1:
            out.update(pp=self.pp, schedule=self.schedule, microbatches=self.microbatches,
                       virtual_stages=len(self.stages) // self.pp if self.stages else 1,
                       split=[items[0] for items in self.stages.stages[1:]]
                       if self.stages else None)
        return out

    def describe(self) -> str:
        shard = {"replicate": "DDP", "optimizer": "ZeRO-1 (DDP + ZeroRedundancyOptimizer)",
                 "gradients": "ZeRO-2 (FSDP2 without resharding after forward)",
                 "full": "FSDP2", None: "no data parallelism"}[self.shard]
        out = f"world {self.world}, dp {self.dp}, {shard}"
        if self.pp > 1:
            out += f", pp {self.pp} ({self.schedule}, {self.microbatches} micro-batches" + (
                f", {len(self.stages)} stages cut before "
                f"{', '.join(s[0] for s in self.stages.stages[1:])})" if self.stages else ")")
        if self.tp > 1:
            out += f", tp {self.tp}" + (f" ({len(self.tp_plan.styles)} linears sharded)"
                                        if self.tp_plan is not None else "")
        if self.shard in ("gradients", "full"):
            out += f" ({len(self.units)} units" + (f", {self.param_dtype} parameters"
                                                  if self.param_dtype else "") + ")"
        if self.checkpointed:
            out += f", checkpointing {', '.join(self.checkpointed)}"
        if self.microbatches > 1 and self.pp == 1:
            out += f", {self.microbatches} micro-batches a step"
        if self.microbatch_size:
            out += f", micro-batch size {self.microbatch_size}"
        return out


def one_step(comms: list, step: int) -> list:
    return [c for c in comms if c.step == step]


def recorded_setup(detail, world: int, layout: Layout, config: dict) -> Setup:
    """The setup of a recording from one rank's step detail
    (viz.analysis.step_detail.RankStepDetail) of its last counted step."""
    step = max(detail.steps)
    comms = one_step(detail.comms, step)
    out = Setup(world)
    gathers = [c for c in comms if c.kind == "all_gather" and c.module is not None]
    scatters = [c for c in comms if c.kind == "reduce_scatter" and c.phase == "grad_sync"]
    reduces = [c for c in comms if c.kind == "all_reduce" and c.phase == "grad_sync"
               and c.module is not None and "DDP" in unwrap(c.module).wrappers]
    if scatters and gathers:
        out.dp_group = scatters[0].group
        out.shard = "full" if any(c.phase == "backward" for c in gathers) else "gradients"
        order = []
        for c in gathers:
            unit = model_path(c.module)
            if c.phase == "forward" and unit not in order:
                order.append(unit)
        out.units = tuple([u for u in order if u != ROOT] + [ROOT])
        out.param_dtype = _gathered_dtype(gathers, layout, out)
    elif reduces:
        out.dp_group = reduces[0].group
        broadcasts = [c for c in comms if c.kind == "broadcast" and c.phase == "optimizer"
                      and c.group == out.dp_group]
        out.shard = "optimizer" if broadcasts and len(broadcasts) >= len(layout.trainable) \
            else "replicate"
    out.dp = len(out.dp_group) if out.dp_group else 1
    out.tp = recorded_tp(layout)
    if config.get("pp") and int(config["pp"]) > 1 and config.get("schedule"):
        # torch.distributed.pipelining's, as tracer.recorder.frameworks.pipelining recorded it
        out.pp, out.schedule = int(config["pp"]), str(config["schedule"])
    mine = detail.ops.step == step
    out.checkpointed = checkpointed_modules(detail.ops, mine)
    out.microbatches = (_int(config.get("microbatches")) or 1) if out.pp > 1 else \
        forward_passes(detail.ops.phase[mine])
    out.microbatch_size = _int(config.get("micro_batch_size")) or leading_dim(detail.ops, mine)
    return out


def recorded_tp(layout: Layout) -> int:
    """The tensor-parallel degree of a recording: the size of the mesh dimension named
    ``tp`` its DTensor parameters are sharded over (FSDP2's own mesh has no such name)."""
    for p in layout.params:
        if p.placements and p.mesh:
            names, sizes = p.mesh
            for placement, name, size in zip(p.placements, names, sizes):
                if name == "tp" and placement.startswith("S("):
                    return int(size)
    return 1


def _int(value) -> Optional[int]:
    try:
        return int(value) if value is not None else None
    except (TypeError, ValueError):
        return None


def _gathered_dtype(gathers: list, layout: Layout, setup: Setup) -> Optional[str]:
    """The dtype FSDP2 gathered in, when not the parameters' own (mixed precision)."""
    units = layout.unit_params(list(setup.units))
    n = len(gathers[0].group)
    for c in gathers:
        params = units.get(model_path(c.module))
        if not params:
            continue
        own = fsdp_bytes(params, n)
        if own and c.nbytes != own:
            elements = own // itemsize(params[0].dtype)
            for dtype in ("bfloat16", "float16", "float32"):
                if elements * itemsize(dtype) == c.nbytes:
                    return dtype
        return None
    return None


def checkpointed_modules(ops, mine: np.ndarray) -> tuple:
    """The modules recomputed in the step: where a checkpoint_wrapper wraps them, the module
    it wraps; else each run of recompute ops' common module."""
    rows = np.nonzero(mine & (ops.phase == _RECOMPUTE))[0]
    if not len(rows):
        return ()
    found: list = []
    run: list = []
    last = None
    for i in rows.tolist():
        if last is not None and i != last + 1:
            _close(run, found)
            run = []
        code = int(ops.module[i])
        run.append(ops.modules[code] if code >= 0 else "")
        last = i
    _close(run, found)
    return tuple(dict.fromkeys(found))


def _close(run: list, found: list) -> None:
    wrapped = [m.split("._checkpoint_wrapped_module")[0] for m in run
               if "._checkpoint_wrapped_module" in m]
    if wrapped:
        found += [model_path(m) for m in dict.fromkeys(wrapped)]
        return
    paths = [model_path(m).split(".") for m in run if m]
    if not paths:
        return
    common = paths[0]
    for p in paths[1:]:
        k = 0
        while k < min(len(common), len(p)) and common[k] == p[k]:
            k += 1
        common = common[:k]
    found.append(".".join(common))


def forward_passes(phase: np.ndarray) -> int:
    """Forward passes in a step: runs of forward ops that a backward op follows."""
    if not len(phase):
        return 1
    is_fwd, is_bwd = phase == _FORWARD, phase == _BACKWARD
    starts = 0
    seen_forward = False
    for f, b in zip(is_fwd.tolist(), is_bwd.tolist()):
        if f:
            seen_forward = True
        elif b and seen_forward:
            starts += 1
            seen_forward = False
    return max(starts, 1)


def leading_dim(ops, mine: np.ndarray) -> Optional[int]:
    """The leading dimension most forward activations (inputs of 3 or more dimensions) share:
    the micro-batch size, on models that keep the batch first."""
    counts: Counter = Counter()
    codes = ops.shapes[mine & (ops.phase == _FORWARD)]
    for code, n in Counter(codes.tolist()).items():
        if code < 0:
            continue
        for arg in parse_shapes(ops.shape_texts[code]):
            for shape in (arg if isinstance(arg, list) else [arg]):
                if isinstance(shape, tuple) and len(shape) >= 3:
                    counts[shape[0]] += n
    return counts.most_common(1)[0][0] if counts else None
