"""Target configurations: the recorded configuration with the options a target names changed,
checked as the reference GPT checks its flags (sample_runs.config), so a target the reference
GPT could not run is refused with one line.

Options (the reference GPT's names): ``tp``, ``sp``, ``pp``, ``dp``, ``schedule``,
``virtual_stages``, ``microbatches``. As in the reference GPT, ``dp`` defaults to the world size
over tp x pp: a target that names no ``dp`` keeps the recorded world, and its degrees must
divide it; a target that names ``dp`` runs on tp x pp x dp ranks. A target that names a
schedule other than interleaved drops the recorded virtual stages.
"""
from __future__ import annotations

OPTIONS = ("tp", "sp", "pp", "dp", "schedule", "virtual_stages", "microbatches")
SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1")
_UNSUPPORTED = {"cp": 1, "zero": 0, "ep": 1, "moe_experts": 0}
_SIZES = ("layers", "hidden", "heads", "seq_len", "vocab", "micro_batch_size")


class TargetError(ValueError):
    """A target that cannot be predicted; the message is one line."""


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def target_config(recorded: dict, changes: dict, world: int) -> dict:
    """The target's full config: ``recorded`` with ``changes`` (option -> value) applied.
    Raises TargetError naming the option at fault."""
    if not changes:
        return dict(recorded)
    for key in ("tp", "pp", "schedule", "microbatches"):
        if recorded.get(key) in (None, ""):
            raise TargetError(f"the recording has no '{key}' in its config (tracer.record_config"
                              f"): only its replay can be predicted, not {_named(changes)}")
    for key, plain in _UNSUPPORTED.items():
        if int(recorded.get(key) or plain) != plain:
            raise TargetError(f"the recording uses {key} {recorded[key]}: predictions of other "
                              f"configurations support tp, sp, pp, dp and schedules only")
    cfg = dict(recorded)
    cfg.update(changes)
    if "schedule" in changes and changes["schedule"] != "interleaved" \
            and "virtual_stages" not in changes:
        cfg["virtual_stages"] = 1
    for key in ("tp", "pp", "virtual_stages", "microbatches", "dp"):
        if cfg.get(key) is not None and int(cfg[key]) < 1:
            raise TargetError(f"{flag(key)} must be >= 1, got {cfg[key]}")
    tp, pp = int(cfg["tp"]), int(cfg["pp"])
    if "dp" in changes:
        dp = int(changes["dp"])
    else:
        if world % (tp * pp):
            raise TargetError(f"world size {world} is not a multiple of tp {tp} x pp {pp} "
                              f"(name --dp to predict another world size)")
        dp = world // (tp * pp)
    cfg["dp"] = dp
    _check_model(cfg, changes)
    _check_schedule(cfg)
    return cfg


def _named(changes: dict) -> str:
    return " ".join(flag(k) for k in changes)


def _check_model(cfg: dict, changes: dict) -> None:
    moved = [k for k in ("tp", "pp", "virtual_stages", "sp") if k in changes]
    missing = [k for k in _SIZES if cfg.get(k) in (None, "")]
    if moved and missing:
        raise TargetError(f"{flag(moved[0])} needs the model's sizes in the recorded config "
                          f"({', '.join(missing)} missing): the layers cannot be re-split")
    tp = int(cfg["tp"])
    for name in ("heads", "hidden", "vocab"):
        if cfg.get(name) is not None and int(cfg[name]) % tp:
            raise TargetError(f"--tp {tp} does not divide {name} {cfg[name]}")
    if cfg.get("sp") and tp > 1 and cfg.get("seq_len") is not None \
            and int(cfg["seq_len"]) % tp:
        raise TargetError(f"--sp needs seq_len divisible by --tp: {cfg['seq_len']} % {tp} != 0")
    stages = int(cfg["pp"]) * int(cfg.get("virtual_stages") or 1)
    if cfg.get("layers") is not None and int(cfg["layers"]) % stages:
        raise TargetError(f"layers {cfg['layers']} is not divisible by pp x virtual stages = "
                          f"{stages}")


def _check_schedule(cfg: dict) -> None:
    schedule, pp = str(cfg["schedule"]), int(cfg["pp"])
    v, m = int(cfg.get("virtual_stages") or 1), int(cfg["microbatches"])
    if schedule not in SCHEDULES:
        raise TargetError(f"--schedule {schedule}: not one of {', '.join(SCHEDULES)}")
    if schedule == "interleaved":
        if v < 2:
            raise TargetError("--schedule interleaved needs --virtual-stages >= 2")
        if pp < 2:
            raise TargetError("--schedule interleaved needs --pp >= 2")
        if m % pp:
            raise TargetError(f"--schedule interleaved needs --microbatches divisible by --pp: "
                              f"{m} % {pp} != 0")
    elif v != 1:
        raise TargetError(f"--virtual-stages {v} needs --schedule interleaved")


def describe(recorded: dict, cfg: dict) -> str:
    """``tp 2 -> 1, dp 1 -> 2``: what a target changed."""
    parts = [f"{k} {recorded.get(k)} -> {cfg.get(k)}" for k in OPTIONS
             if str(recorded.get(k)) != str(cfg.get(k))]
    return ", ".join(parts) or "the recorded configuration"


def changed(recorded: dict, cfg: dict, *keys: str) -> bool:
    return any(str(recorded.get(k)) != str(cfg.get(k)) for k in keys)
