"""What if: predict the step of another parallel configuration from one recording.

    from viz.whatif import what_if
    result = what_if(analysis, [{"schedule": "gpipe"}, {"pp": 1, "dp": 2}])
    result.replayed, result.targets[0].measures, result.targets[0].assumptions

The recording becomes an execution graph (:mod:`viz.whatif.replay.graph`: each rank's program of
compute, launches, waits and passes; collectives and P2P messages tying the programs), which
replays with its measured durations (:mod:`viz.whatif.replay.simulate`) to reproduce the step
before any prediction is trusted. A target changes the reference GPT's options
(:mod:`viz.whatif.reference_gpt.targets`); its programs are rebuilt from the recorded parts of a
step (:mod:`viz.whatif.reference_gpt.anatomy`, :mod:`viz.whatif.reference_gpt.plan`,
:mod:`viz.whatif.replay.compose`) with models fitted on the same recording
(:mod:`viz.whatif.replay.models`, :mod:`viz.whatif.reference_gpt.costs`) and Megatron's rules
(:mod:`viz.whatif.reference_gpt.megatron`), then simulated the same way. A recording with memory
(the default; not under ``--no-memory``) also gets each target's peak memory by category
(:mod:`viz.whatif.reference_gpt.gpt_memory`). Pure: no file is read or written here (the command,
:mod:`viz.whatif_cli`, and the renderers, :mod:`viz.render.whatif`, do).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..analysis.timeline.lanes import Timeline
from ..analysis.timeline.metrics import metrics_of
from .model_predict import predict_model, replayed_memory, study_model
from .model_targets import is_model_target, model_target, title
from .reference_gpt.gpt_comm_rows import step_rows
from .reference_gpt.gpt_memory import memory_model, predicted, recorded_peaks
from .reference_gpt.megatron import shape_of
from .reference_gpt.plan import Plan
from .reference_gpt.recording import Recording, study
from .reference_gpt.targets import TargetError, describe, target_config
from .replay.measures import measures
from .replay.simulate import SimulationError, as_timeline, simulate
from .replay.waits import late_completions

__all__ = ["what_if", "WhatIf", "Prediction", "TargetError", "SimulationError"]


@dataclass
class Prediction:
    """One target: its config, what it changed, its simulated timeline and measures."""

    config: dict
    changes: dict
    timeline: Timeline
    metrics: dict                    # rank -> viz.analysis.timeline.metrics.RankMetrics
    measures: dict                   # whatif.json's M
    assumptions: list
    # rank -> predicted peak by category (viz.whatif.reference_gpt.gpt_memory)
    memory: Optional[dict] = None
    collectives: Optional[dict] = None   # rank -> one step's comm rows (summary.json's)
    name: Optional[str] = None       # the title, where the changes do not make it

    @property
    def title(self) -> str:
        if self.name:
            return self.name
        return " ".join(f"--{k.replace('_', '-')} {v}" for k, v in self.changes.items()) \
            or "the recorded configuration"


@dataclass
class WhatIf:
    """The recording's measures, its replay, and every target's prediction."""

    config: dict
    measured: dict
    replayed: dict
    replay: Timeline
    replay_metrics: dict
    models: list                     # how well each fitted model describes the recording
    targets: list = field(default_factory=list)   # Prediction
    memory: Optional[dict] = None    # rank -> the recording's peak by category
    memory_replayed: Optional[dict] = None   # the same, predicted for the recorded config
    setup: Optional[str] = None      # the recorded setup in words, read from the recording


def what_if(analysis, targets: list, details: Optional[dict] = None,
            run_dir: str = "the recording") -> WhatIf:
    """Replay ``analysis`` (a viz.analysis.RunAnalysis) and predict each target (option ->
    value: the reference GPT's names, tp, sp, pp, dp, schedule, virtual_stages,
    microbatches; or, on any model, viz.whatif.model_targets' options, which need
    ``details``: rank -> viz.analysis.step_detail.RankStepDetail). Raises TargetError for a
    target that cannot be predicted."""
    groups = {r: mine.counted_op_groups for r, mine in analysis.ranks.items()}
    late = frozenset(r for r, mine in analysis.ranks.items() if late_completions(mine.meta))
    backends = {mine.meta.get("backend") for mine in analysis.ranks.values()}
    rec = study(analysis.timeline, analysis.cross.matched, groups, analysis.world_size, late,
                backends.pop() if len(backends) == 1 else None)
    gpt = rec.shape is not None
    sim = simulate(rec.graph, rec.graph.starts)
    model = study_model(rec, sim, details or {}, analysis.world_size, rec.config,
                        {t: g.dimension for t, g in analysis.group_dimensions.items()})
    pipelined = int(rec.config.get("pp") or 1) > 1
    configs = [None if is_model_target(t, gpt, pipelined) else
               target_config(rec.config, dict(t), rec.world) for t in targets]
    setups = [model_setup(model, dict(t), run_dir) if c is None else None
              for t, c in zip(targets, configs)]
    replay = as_timeline(rec.graph, sim, rec.config)
    replay_metrics = metrics_of(replay)
    out = WhatIf(rec.config, measures(analysis.metrics), measures(replay_metrics), replay,
                 replay_metrics, rec.model_lines())
    if model is not None:
        out.setup = model.setup.describe()
    memory = memory_model(analysis, rec.shape, rec.grid)
    peaks = recorded_peaks(analysis)
    if peaks:
        out.memory = {str(r): {"peak_bytes": sum(at.values()), "by_category": at}
                      for r, at in sorted(peaks.items())}
    if memory is not None:
        out.memory_replayed = predicted(memory, rec.shape)
    elif model is not None and model.has_memory:
        out.memory_replayed = replayed_memory(model)
    for changes, cfg, setup in zip(targets, configs, setups):
        if setup is not None:
            out.targets.append(_on_model(rec, model, setup, dict(changes)))
            continue
        prediction = predict(rec, cfg, dict(changes))
        prediction.memory = predicted(memory, shape_of(cfg))
        out.targets.append(prediction)
    return out


def model_setup(model, changes: dict, run_dir: str):
    """A target on any model's setup (viz.whatif.model_targets), checked."""
    if model is None:
        raise TargetError(f"{title(changes)}: predictions on any model need the recording's "
                          "step detail (trace-whatif reads it)")
    return model_target(model.setup, changes, model.layout, model.modules(),
                        model.has_memory, run_dir,
                        model.sequence() if "split" in changes else None)


def _on_model(rec: Recording, model, setup, changes: dict) -> Prediction:
    found = predict_model(rec, model, setup)
    config = {**rec.config, **setup.config()}
    return Prediction(config, changes, found.timeline, found.metrics, found.measures,
                      found.assumptions, found.memory, found.collectives, title(changes))


def predict(rec: Recording, cfg: dict, changes: dict) -> Prediction:
    """One target's prediction from a studied recording."""
    plan = Plan(rec, cfg)
    graph = plan.build()
    try:
        sim = simulate(graph)
    except SimulationError as err:
        raise TargetError(f"{describe(rec.config, cfg)}: {err}") from None
    timeline = as_timeline(graph, sim, cfg)
    metrics = metrics_of(timeline)
    steps = max(a.steps for a in rec.anatomies.values())
    assumptions = [f"changes {describe(rec.config, cfg)}; {steps} steps simulated after one "
                   "warm-up step, every rank starting together"] + plan.assumptions
    return Prediction(cfg, changes, timeline, metrics, measures(metrics), assumptions,
                      collectives=step_rows(graph, sim))
