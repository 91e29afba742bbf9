"""Targets on any model: the recorded setup (viz.whatif.recorded.setup) with what a target names
changed, checked against what the recording holds, so that a target it cannot support is
refused with one line saying what is missing.

Options: ``dp`` (the data-parallel degree: a world of dp x tp ranks), ``tp`` with
``tp_plan`` (tensor parallelism: module PATTERN -> colwise | rowwise, viz.whatif.edits.tp_plan),
``shard``
(replicate, optimizer, gradients, full), ``shard_units`` (PATTERNs of FSDP2's units),
``param_dtype`` (bf16, fp32: FSDP2's mixed precision), ``checkpoint`` (PATTERNs of the
modules to checkpoint, non-reentrant), ``no_checkpoint``, ``microbatch_size``,
``grad_accum``; ``pp`` with ``split`` (PATTERNs of the modules where stages begin),
``schedule`` and ``microbatches`` (torch.distributed.pipelining, viz.whatif.pipeline.pp_stages).
PATTERNs match module paths on the unwrapped model (tracer.vocab.model_paths.matches):
``layers.*``, ``**.mlp``, comma-separated.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Optional

from tracer.vocab.model_paths import matches

from .edits.tp_plan import tp_plan
from .pipeline.pp_stages import cut
from .recorded.layout import Layout
from .recorded.setup import SHARDINGS, Setup
from .reference_gpt.targets import TargetError

OPTIONS = ("dp", "shard", "shard_units", "param_dtype", "checkpoint", "no_checkpoint",
           "microbatch_size", "grad_accum", "tp_plan", "split")
PIPELINE = ("pp", "split", "schedule", "microbatches", "virtual_stages")
GPT_ONLY = ("sp",)
PP_SCHEDULES = ("gpipe", "1f1b", "interleaved")
MEMORY_QUESTIONS = ("shard", "shard_units", "param_dtype", "checkpoint", "no_checkpoint")
DTYPES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16",
          "float16": "float16", "fp32": None, "float32": None}


def is_model_target(changes: dict, reference_gpt: bool, pipelined: bool = False) -> bool:
    """Whether a target is predicted by these rules: it names one of their own options, or
    names only ``dp`` (and ``tp``) on a run that is not the reference GPT's, or pipeline
    options on a run of neither the reference GPT nor a pipeline (``pipelined``: a recording
    of torch.distributed.pipelining, whose schedule and micro-batches viz.whatif.reference_gpt.plan
    predicts)."""
    if any(k in OPTIONS and k != "dp" for k in changes):
        return True
    if not reference_gpt and not pipelined and any(k in PIPELINE for k in changes):
        return True
    return not reference_gpt and bool(changes) and set(changes) <= {"dp", "tp"}


def flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def title(changes: dict) -> str:
    words = []
    for key, value in changes.items():
        if key == "tp_plan":
            value = f"({len(value)} patterns)"
        words.append(flag(key) if value is True else f"{flag(key)} {value}")
    return " ".join(words)


def _patterns(text: str) -> list:
    return [p.strip() for p in str(text).split(",") if p.strip()]


def matched(patterns: str, modules: list, option: str) -> list:
    """The outermost modules matching any PATTERN; TargetError where one matches none."""
    found = []
    for pattern in _patterns(patterns):
        hits = [m for m in modules if m and matches(pattern, m)]
        if not hits:
            raise TargetError(f"{option} {pattern!r} matches no module of the model (its "
                              f"modules: {_sample(modules)})")
        found += hits
    found = sorted(set(found), key=modules.index)
    return [m for m in found if not any(m.startswith(o + ".") for o in found)]


def _sample(modules: list) -> str:
    shown = [m for m in modules if m][:8]
    return ", ".join(shown) + (", ..." if len([m for m in modules if m]) > 8 else "")


def model_target(rec: Setup, changes: dict, layout: Optional[Layout], modules: list,
                 has_memory: bool, run_dir: str = "the recording",
                 sequence: Optional[list] = None) -> Setup:
    """The target's setup; TargetError (one line) for one the recording cannot support.
    ``sequence``: the model's top-level sequence (viz.whatif.pipeline.pp_stages.top_level)."""
    unknown = [k for k in changes if k in GPT_ONLY]
    if unknown:
        raise TargetError(f"{flag(unknown[0])} is the reference GPT's option: a target on "
                          "any model names only " + ", ".join(flag(k) for k in OPTIONS) +
                          ", --tp, --pp, --schedule and --microbatches")
    if any(k in PIPELINE for k in changes):
        return _pipeline(rec, changes, modules, sequence or [])
    if rec.pp > 1:
        raise TargetError(f"the recording runs a pipeline (pp {rec.pp}, {rec.schedule}): of "
                          "the options on any model, none is predicted from it (its schedule "
                          "and micro-batches are: --schedule, --microbatches)")
    asks = [k for k in changes if k in MEMORY_QUESTIONS]
    if asks and not has_memory:
        raise TargetError(f"{flag(asks[0])} is a memory question and {run_dir} has no memory "
                          "recorded (it was recorded with --no-memory: record it without)")
    out = replace(rec)
    needs_layout = "shard" in changes or "shard_units" in changes or "param_dtype" in changes \
        or ("dp" in changes and rec.shard is not None)
    if needs_layout and (layout is None or not layout.params):
        raise TargetError(f"{run_dir} has no parameter layout (traces written before "
                          "paratrace recorded each root module's parameters): its sharding "
                          "cannot be changed")
    _tensor(out, rec, changes, layout, modules)
    if "dp" in changes:
        out.dp = int(changes["dp"])
        out.world = out.dp * out.tp
        out.dp_group = tuple(range(0, out.world, out.tp))
        if out.shard is None and out.dp > 1:
            raise TargetError(f"--dp {out.dp}: the recording has no data parallelism to "
                              "scale (name --shard to add it)")
    if "shard" in changes:
        if changes["shard"] not in SHARDINGS:
            raise TargetError(f"--shard {changes['shard']}: not one of {', '.join(SHARDINGS)}")
        out.shard = changes["shard"]
        if out.dp < 2 and out.world > out.tp:
            out.dp = out.world // out.tp
    if out.tp > 1 and out.dp == 1:          # a TP run with no data parallelism to wrap
        out.shard, out.units, out.param_dtype, out.dp_group = None, (), None, ()
    _units(out, rec, changes, layout, modules)
    if "param_dtype" in changes:
        if str(changes["param_dtype"]) not in DTYPES:
            raise TargetError(f"--param-dtype {changes['param_dtype']}: one of bf16, fp16, fp32")
        if out.shard not in ("gradients", "full"):
            raise TargetError("--param-dtype is FSDP2's mixed precision: it needs --shard "
                              "gradients or full")
        out.param_dtype = DTYPES[str(changes["param_dtype"])]
    _checkpoint(out, rec, changes, modules)
    if "microbatch_size" in changes:
        if not rec.microbatch_size:
            raise TargetError("--microbatch-size: the recorded micro-batch size is unknown (no "
                              "activation of 3 or more dimensions in the forward, nor "
                              "micro_batch_size in its config)")
        out.microbatch_size = int(changes["microbatch_size"])
    if "grad_accum" in changes:
        out.microbatches = int(changes["grad_accum"])
    for key in ("dp", "microbatch_size", "grad_accum"):
        if key in changes and int(changes[key]) < 1:
            raise TargetError(f"{flag(key)} must be >= 1, got {changes[key]}")
    return out


def _pipeline(rec: Setup, changes: dict, modules: list, sequence: list) -> Setup:
    """``--pp N --split PATTERN[,...] [--schedule S] [--microbatches M]``: the model cut into
    stages on N ranks of torch.distributed.pipelining, without data parallelism."""
    if rec.pp > 1 and ("split" in changes or "pp" in changes):
        raise TargetError(f"{flag('split' if 'split' in changes else 'pp')}: the recording "
                          f"runs a pipeline (pp {rec.pp}) already: another split is "
                          "predicted from a recording without one")
    if "split" not in changes or "pp" not in changes:
        raise TargetError("a pipeline on any model needs --pp N and --split MODULE[,...] (the "
                          "modules where stages begin, e.g. --pp 2 --split layers.2)")
    mixed = [k for k in changes if k not in PIPELINE + ("dp", "microbatch_size")]
    if mixed:
        raise TargetError(f"{flag(mixed[0])} with --pp: a pipeline on any model is predicted "
                          "alone (with --microbatches and --microbatch-size), not with "
                          "sharding, checkpointing or TP changes")
    pp = int(changes["pp"])
    if pp < 2:
        raise TargetError(f"--pp {pp} with --split: a pipeline needs 2 ranks or more")
    if "dp" not in changes and rec.world % pp:
        raise TargetError(f"world size {rec.world} is not a multiple of --pp {pp} (name --dp 1 "
                          f"to predict a world of {pp})")
    dp = int(changes.get("dp", rec.world // pp))
    if dp != 1:
        raise TargetError(f"--pp {pp} on a world of {dp * pp} leaves dp {dp}: a pipeline with "
                          "data parallelism is not predicted on any model (name --dp 1 for a "
                          f"world of {pp})")
    schedule = str(changes.get("schedule", "1f1b"))
    if schedule not in PP_SCHEDULES:
        raise TargetError(f"--schedule {schedule}: on any model one of "
                          f"{', '.join(PP_SCHEDULES)}")
    stages = cut(changes["split"], sequence, modules, pp)
    chunks = len(stages) // pp
    if "virtual_stages" in changes and int(changes["virtual_stages"]) != chunks:
        raise TargetError(f"--virtual-stages {changes['virtual_stages']}: --split makes "
                          f"{len(stages)} stages, {chunks} a rank of {pp}")
    if (chunks > 1) != (schedule == "interleaved"):
        runs = "2 stages a rank or more" if schedule == "interleaved" else "one stage a rank"
        raise TargetError(f"--schedule {schedule} runs {runs}: --split makes {len(stages)} "
                          f"stages for --pp {pp}")
    microbatches = int(changes.get("microbatches", rec.microbatches))
    if microbatches < 1:
        raise TargetError(f"--microbatches must be >= 1, got {microbatches}")
    if schedule == "1f1b" and microbatches < pp:
        raise TargetError(f"--schedule 1f1b needs --microbatches >= --pp {pp} (torch's "
                          f"Schedule1F1B refuses fewer), got {microbatches}")
    rounds = max(1, microbatches // pp)
    if schedule == "interleaved" and microbatches % rounds:
        raise TargetError(f"--schedule interleaved runs --microbatches in rounds of "
                          f"{microbatches // rounds} (torch's ScheduleInterleaved1F1B): "
                          f"{microbatches} is not a multiple of {rounds}")
    out = replace(rec, world=pp, dp=1, shard=None, units=(), param_dtype=None, dp_group=(),
                  pp=pp, schedule=schedule, stages=stages, microbatches=microbatches)
    if "microbatch_size" in changes:
        if not rec.microbatch_size:
            raise TargetError("--microbatch-size: the recorded micro-batch size is unknown")
        out.microbatch_size = int(changes["microbatch_size"])
    return out


def _tensor(out: Setup, rec: Setup, changes: dict, layout: Optional[Layout],
            modules: list) -> None:
    """``--tp N --tp-plan PLAN``: the plan checked; the world kept (dp = world / tp) unless
    ``--dp`` is named; no data-parallel wrapper left where dp is 1."""
    if "tp" not in changes and "tp_plan" not in changes:
        return
    if rec.tp > 1:
        raise TargetError(f"the recording runs tensor parallelism (tp {rec.tp}): another TP "
                          "degree or plan is predicted from a recording without it")
    if "tp_plan" not in changes or "tp" not in changes:
        raise TargetError("--tp on any model needs --tp-plan FILE (module PATTERN -> colwise "
                          "or rowwise), and --tp-plan needs --tp")
    if layout is None or not layout.params:
        raise TargetError("--tp needs the recording's parameter layout (traces written before "
                          "paratrace recorded it)")
    out.tp = int(changes["tp"])
    out.tp_plan = tp_plan(dict(changes["tp_plan"]), out.tp, layout, modules)
    if "dp" not in changes:
        if rec.world % out.tp:
            raise TargetError(f"world size {rec.world} is not a multiple of --tp {out.tp} "
                              "(name --dp to predict another world size)")
        out.dp = rec.world // out.tp
        out.dp_group = tuple(range(0, rec.world, out.tp))


def _units(out: Setup, rec: Setup, changes: dict, layout: Optional[Layout],
           modules: list) -> None:
    if "shard_units" in changes:
        if out.shard not in ("gradients", "full"):
            raise TargetError("--shard-units names FSDP2's units: it needs --shard gradients "
                              "or full")
        matched(changes["shard_units"], modules, "--shard-units")
        out.units = tuple(layout.units(changes["shard_units"]))
    elif out.shard in ("gradients", "full") and (rec.shard not in ("gradients", "full")
                                                  or not rec.units):
        out.units = tuple(layout.units(None))
    if out.shard not in ("gradients", "full"):
        out.units, out.param_dtype = (), None


def _checkpoint(out: Setup, rec: Setup, changes: dict, modules: list) -> None:
    if changes.get("no_checkpoint"):
        if "checkpoint" in changes:
            raise TargetError("--checkpoint and --no-checkpoint: name one")
        if not rec.checkpointed:
            raise TargetError("--no-checkpoint: the recording checkpoints no module")
        out.checkpointed = ()
    elif "checkpoint" in changes:
        out.checkpointed = tuple(matched(changes["checkpoint"], modules, "--checkpoint"))
