"""Targets on any model: the recorded setup (viz.whatif.setup) with what a target names
changed, checked against what the recording holds, so that a target it cannot support is
refused with one line saying what is missing.

Options: ``dp`` (the data-parallel degree: a world of that many ranks), ``shard``
(replicate, optimizer, gradients, full), ``shard_units`` (PATTERNs of FSDP2's units),
``param_dtype`` (bf16, fp32: FSDP2's mixed precision), ``checkpoint`` (PATTERNs of the
modules to checkpoint, non-reentrant), ``no_checkpoint``, ``microbatch_size``,
``grad_accum``. PATTERNs match module paths on the unwrapped model
(tracer.vocab.model_paths.matches): ``layers.*``, ``**.mlp``, comma-separated.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Optional

from tracer.vocab.model_paths import matches

from .layout import Layout
from .setup import SHARDINGS, Setup
from .targets import TargetError

OPTIONS = ("dp", "shard", "shard_units", "param_dtype", "checkpoint", "no_checkpoint",
           "microbatch_size", "grad_accum")
GPT_ONLY = ("tp", "sp", "pp", "schedule", "virtual_stages", "microbatches")
MEMORY_QUESTIONS = ("shard", "shard_units", "param_dtype", "checkpoint", "no_checkpoint")
DTYPES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp16": "float16",
          "float16": "float16", "fp32": None, "float32": None}


def is_model_target(changes: dict, reference_gpt: bool) -> bool:
    """Whether a target is predicted by these rules: it names one of their own options, or
    names only ``dp`` on a run that is not the reference GPT's."""
    if any(k in OPTIONS and k != "dp" for k in changes):
        return True
    return "dp" in changes and not reference_gpt and set(changes) <= {"dp"}


def flag(key: str) -> str:
    return "--" + key.replace("_", "-")


def title(changes: dict) -> str:
    words = []
    for key, value in changes.items():
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
                 has_memory: bool, run_dir: str = "the recording") -> Setup:
    """The target's setup; TargetError (one line) for one the recording cannot support."""
    unknown = [k for k in changes if k in GPT_ONLY]
    if unknown:
        raise TargetError(f"{flag(unknown[0])} with {flag(next(k for k in changes if k in OPTIONS))}"
                          ": a target changes either the reference GPT's layout or these "
                          "options, not both")
    asks = [k for k in changes if k in MEMORY_QUESTIONS]
    if asks and not has_memory:
        raise TargetError(f"{flag(asks[0])} is a memory question and {run_dir} has no memory "
                          "recorded (record it with trace-run --memory)")
    out = replace(rec, notes=[])
    needs_layout = "shard" in changes or "shard_units" in changes or "param_dtype" in changes \
        or ("dp" in changes and rec.shard is not None)
    if needs_layout and (layout is None or not layout.params):
        raise TargetError(f"{run_dir} has no parameter layout (traces written before "
                          "paratrace recorded each root module's parameters): its sharding "
                          "cannot be changed")
    if "dp" in changes:
        out.dp = int(changes["dp"])
        out.world = out.dp
        out.dp_group = tuple(range(out.dp))
        if out.shard is None and out.dp > 1:
            raise TargetError(f"--dp {out.dp}: the recording has no data parallelism to "
                              "scale (name --shard to add it)")
    if "shard" in changes:
        if changes["shard"] not in SHARDINGS:
            raise TargetError(f"--shard {changes['shard']}: not one of {', '.join(SHARDINGS)}")
        out.shard = changes["shard"]
        if out.dp < 2 and out.world > 1:
            out.dp = out.world
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
