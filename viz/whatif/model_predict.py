"""Predictions on any model (viz.whatif.model_targets): each predicted rank's steps edited
from its source rank's recorded ones (viz.whatif.edits.edit), simulated; its peak memory replayed
from the recorded step's storages (viz.whatif.memory.step_memory); its collectives of one step,
shaped as summary.json's ``ranks.R.comm``.

Predicted rank r takes its work from recorded rank r modulo the recorded world (data
parallelism: every rank does the same work on its own data).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

from tracer.vocab.groups import group_text
from tracer.vocab.model_paths import model_path

from ..analysis.crossrank.dimensions import WORLD
from ..analysis.timeline.metrics import metrics_of
from .edits.dp_plan import is_dp_comm, plan_dp
from .edits.edit import StepEdit, checkpoint_edits, dp_owned, emit, micro_scale, timed_nodes
from .edits.tp_plan import local_layout, plan_tp
from .memory.memory_replay import held_elements
from .memory.step_memory import step_memory
from .pipeline.pp_predict import predict_pipeline
from .pipeline.pp_stages import top_level
from .recorded.axis import Axis
from .recorded.layout import Layout
from .recorded.setup import Setup, one_step, recorded_setup
from .recorded.windows import step_windows
from .reference_gpt.targets import TargetError
from .replay.compose import Programs
from .replay.measures import measures
from .replay.simulate import SimulationError, as_timeline, simulate


@dataclass
class ModelRecording:
    """What predictions on any model know of a recording, studied once."""

    setup: Setup
    layout: Layout
    details: dict                     # rank -> viz.analysis.step_detail.RankStepDetail
    nodes: dict                       # rank -> step -> the replay's timed nodes
    windows: dict = field(default_factory=dict)    # (rank, step) -> StepWindows
    dimensions: dict = field(default_factory=dict)   # group text -> its recorded dimension

    def windows_of(self, rank: int, step: int):
        if (rank, step) not in self.windows:
            self.windows[(rank, step)] = step_windows(self.details[rank].ops, step)
        return self.windows[(rank, step)]

    @property
    def has_memory(self) -> bool:
        return any(d.storages for d in self.details.values())

    def sequence(self) -> list:
        """The model's top-level sequence (viz.whatif.pipeline.pp_stages.top_level), from the first
        rank's last counted step."""
        rank = min(self.details)
        windows = self.windows_of(rank, max(self.details[rank].steps))
        return top_level(windows, self.layout, self.modules())

    def modules(self) -> list:
        """Every module path of the model: those holding parameters and those ops ran in."""
        found = set(self.layout.modules())
        for detail in self.details.values():
            for name in detail.ops.modules:
                parts = model_path(name).split(".")
                found.update(".".join(parts[:i]) for i in range(1, len(parts) + 1))
        return sorted(found)


def study_model(rec, sim, details: dict, world: int, config: dict,
                dimensions: dict) -> Optional[ModelRecording]:
    """``rec``: the viz.whatif.reference_gpt.recording.Recording; ``sim``: its replay; ``details``:
    rank ->
    step detail. None without details."""
    if not details:
        return None
    layout = Layout.from_meta(next(iter(details.values())).parameters)
    first = details[min(details)]
    setup = recorded_setup(first, world, layout, config)
    nodes = {r: timed_nodes(rec.graph.programs[r], sim.done, r, rec.graph.starts.get(r, 0))
             for r in details if r in rec.graph.programs}
    return ModelRecording(setup, layout, details, nodes, dimensions=dimensions)


@dataclass
class ModelPrediction:
    timeline: object
    metrics: dict
    measures: dict
    memory: Optional[dict]
    collectives: dict
    assumptions: list


def predict_model(rec, model: ModelRecording, tgt: Setup) -> ModelPrediction:
    """One target's prediction (``rec``: the viz.whatif.reference_gpt.recording.Recording)."""
    if tgt.pp > 1:
        return ModelPrediction(*predict_pipeline(rec, model, tgt, batch_ratio(model, tgt)))
    source_world = rec.world
    programs = Programs(rec.graph.clock)
    memory, collectives = {}, {}
    for rank in range(tgt.world):
        src = rank % source_world
        if src not in model.details:
            raise TargetError(f"rank {src} of the recording has no readable trace: a "
                              "prediction needs every rank's steps")
        detail = model.details[src]
        programs.start(rank)
        steps = list(detail.steps)
        for index, step in enumerate([steps[0]] + steps):
            windows = model.windows_of(src, step)
            emit(programs, rank, index, _step(rec, model, tgt, rank, src, step, windows))
        last = steps[-1]
        windows = model.windows_of(src, last)
        axis = Axis(windows, tgt.microbatches)
        planned = planned_comms(model, tgt, detail, windows, axis, last, rank)
        collectives[str(rank)] = _rows(model, tgt, detail, axis, planned, last)
        if detail.memory_step == last:
            memory[str(rank)] = step_memory(model.setup, tgt, model.layout, detail, windows,
                                            axis, planned, rank)
    graph = programs.graph
    graph.config = tgt.config()
    graph.pipeline_groups = {r: (r,) for r in range(tgt.world)}
    try:
        sim = simulate(graph)
    except SimulationError as err:
        raise TargetError(str(err)) from None
    timeline = as_timeline(graph, sim, {})
    metrics = metrics_of(timeline)
    return ModelPrediction(timeline, metrics, measures(metrics),
                           memory if memory and all(memory.values()) else None, collectives,
                           assumptions(model.setup, tgt))


def replayed_memory(model: ModelRecording) -> Optional[dict]:
    """Each recorded rank's peak as the memory model replays the recorded setup (None for a
    pipeline's: its runtime's storages are modelled for a predicted pipeline only)."""
    if model.setup.pp > 1:
        return None
    out = {}
    for rank, detail in sorted(model.details.items()):
        if not detail.storages:
            return None
        step = detail.memory_step
        windows = model.windows_of(rank, step)
        axis = Axis(windows, model.setup.microbatches)
        planned = planned_comms(model, model.setup, detail, windows, axis, step, rank)
        out[str(rank)] = step_memory(model.setup, model.setup, model.layout, detail, windows,
                                     axis, planned, rank)
    return out


def _step(rec, model: ModelRecording, tgt: Setup, rank: int, src: int, step: int,
          windows) -> list:
    """The items of predicted rank ``rank``'s copy of recorded step ``step`` of ``src``."""
    detail = model.details[src]
    nodes = model.nodes[src].get(step, [])
    comms = one_step(detail.comms, step)
    axis = Axis(windows, tgt.microbatches)
    planned = planned_comms(model, tgt, detail, windows, axis, step, rank)

    def transfer(kind: str, group: tuple, nbytes: int) -> float:
        return rec.collectives.time(kind, len(group), nbytes, "dp")[0]
    edit = StepEdit(axis, windows, dp_owned(nodes, comms, model.setup), planned, transfer,
                    src, lambda g: _regroup(g, rank, rec.world, tgt.world))
    checkpoint_edits(edit, nodes, model.setup.checkpointed, tgt.checkpointed)
    edit.scaled += micro_scale(detail.ops, windows, nodes, rec.ops, batch_ratio(model, tgt),
                               tgt.tp_plan, step)
    held = held_elements(model.setup, model.layout, src)
    if windows.optimizer is not None and held:
        # the optimizer steps the elements the rank holds (ZeRO-1's partition, FSDP2's shards)
        edit.scaled.append((windows.optimizer[0], windows.optimizer[1] + 1,
                            held_elements(tgt, local_layout(model.layout, tgt.tp_plan), rank)
                            / held))
    return edit.items(nodes, rec.graph)


def batch_ratio(model: ModelRecording, tgt: Setup) -> float:
    """The micro-batch size's ratio, target over recorded."""
    rec = model.setup.microbatch_size
    return tgt.microbatch_size / rec if tgt.microbatch_size and rec else 1.0


def planned_comms(model: ModelRecording, tgt: Setup, detail, windows, axis, step: int,
                  rank: int) -> list:
    """The target's data-parallel and tensor-parallel communications of one step."""
    local = local_layout(model.layout, tgt.tp_plan)
    return plan_dp(model.setup, tgt, local, windows, axis, one_step(detail.comms, step),
                   rank) + plan_tp(tgt, model.layout, windows, axis, detail.ops, step, rank,
                                   batch_ratio(model, tgt))


def _regroup(group: tuple, rank: int, recorded: int, world: int) -> tuple:
    """A recorded group on the predicted world: the whole recorded world becomes the whole
    predicted one; other groups move with the copy of the recorded world ``rank`` is in."""
    if tuple(sorted(group)) == tuple(range(recorded)):
        return tuple(range(world))
    offset = (rank // recorded) * recorded
    return tuple(g + offset for g in group)


def _rows(model: ModelRecording, tgt: Setup, detail, axis: Axis, planned: list,
          step: int) -> list:
    """summary.json's ``comm`` rows of one predicted step: kind, phase, group, dimension,
    count, bytes."""
    counts: Counter = Counter()
    sizes: Counter = Counter()
    roles: dict = {}
    for p in planned:
        key = (p.kind, p.phase, tuple(p.group))
        counts[key] += 1
        sizes[key] += p.nbytes
        roles[tuple(p.group)] = p.role
    for c in one_step(detail.comms, step):
        if is_dp_comm(c, model.setup):
            continue
        group = _regroup(c.group, detail.rank, model.setup.world, tgt.world) if c.group \
            else ()
        for _ in axis.places(c.t0) or [0]:
            key = (c.kind, c.phase, group)
            counts[key] += 1
            sizes[key] += c.nbytes
    return [{"kind": kind, "phase": phase, "group": list(group),
             "dimension": _dimension(model, group, tgt.world, roles.get(group, "dp")),
             "count": counts[(kind, phase, group)], "bytes": sizes[(kind, phase, group)]}
            for kind, phase, group in sorted(counts)]


def _dimension(model: ModelRecording, group: tuple, world: int, role: str) -> str:
    """The dimension summary.json would give the group (viz.analysis.crossrank.dimensions): a group
    of every rank is ``world`` (the default process group, as DDP and a mesh of one
    dimension use it, names none), the recorded one's where the world keeps its size, else
    its role (a DeviceMesh names the groups of its dimensions). A TP plan runs over a
    DeviceMesh's ``tp`` dimension, which names its groups even where one spans the world."""
    if role == "tp":
        return role
    if tuple(sorted(group)) == tuple(range(world)):
        return WORLD
    if world == model.setup.world:
        found = model.dimensions.get(group_text(group))
        if found:
            return found
    return role


def assumptions(rec: Setup, tgt: Setup) -> list:
    """What a prediction on any model took for granted (docs/whatif.md)."""
    out = [f"recorded: {rec.describe()}; predicted: {tgt.describe()}",
           "every predicted rank does its recorded rank's work (rank r takes recorded rank r "
           "modulo the recorded world); compute and host time as recorded"]
    if tgt.tp_plan is not None:
        out.append(f"tensor parallelism {tgt.tp} (docs/whatif.md): a row-parallel linear "
                   "all-reduces its output in forward, a column-parallel one its input's "
                   "gradient in backward, each blocking, timed by the collective model fitted "
                   "on the recording; the compute and working memory of the sharded linears "
                   "and of what runs between them divided by the degree")
    if tgt.shard != rec.shard or tgt.dp != rec.dp or tgt.units != rec.units:
        out.append("data-parallel collectives as DDP, ZeroRedundancyOptimizer and FSDP2 issue "
                   "them (docs/whatif.md), timed by the collective model fitted on the "
                   "recording; FSDP2's copy-in and copy-out compute and its hooks' host time "
                   "(large on a CPU) not modelled")
    if tgt.checkpointed != rec.checkpointed:
        out.append("a checkpointed module's recomputation costs its measured forward "
                   "(non-reentrant checkpointing, recomputed just before its backward)")
    if tgt.microbatch_size != rec.microbatch_size:
        out.append(f"micro-batch size {rec.microbatch_size} -> {tgt.microbatch_size}: each "
                   "op's time by the op-cost model at its work times the ratio, activations "
                   "and temporaries in proportion")
    if tgt.microbatches != rec.microbatches:
        out.append(f"{tgt.microbatches} micro-batches a step, each a copy of the recorded "
                   "last; DDP synchronises on the last only (no_sync), FSDP2 on each")
    if tgt.param_dtype != rec.param_dtype:
        out.append(f"FSDP2 parameters in {tgt.param_dtype or 'their own dtype'}: the "
                   "forward's and backward's activations and temporaries in proportion "
                   "(ops a model casts to float32 itself are not seen in a float32 "
                   "recording); compute time unchanged")
    return out
