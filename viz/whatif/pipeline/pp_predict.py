"""A pipeline on any model (``--pp N --split MODULE[,...] --schedule S --microbatches M``),
predicted from a recording without one: the model cut into stages at module boundaries
(viz.whatif.pipeline.pp_stages), stage i on rank i mod N (torch.distributed.pipelining's placement;
an interleaved rank runs several), no data parallelism.

Each rank's step: the recorded work before the first micro-batch (the data, made for all
micro-batches at once), its passes in the schedule's order (tracer.vocab.schedules' GPipe and 1F1B,
which are torch's; viz.whatif.reference_gpt.torch_plans' ScheduleInterleaved1F1B), each a stage's
forward or backward of one micro-batch with the compute its window of the recorded micro-batch
holds (the op-cost model scaling it to another micro-batch size), the activation received before a
forward and sent after it, its gradient received before a backward and sent after, their bytes from
the recorded shapes and their time from the P2P link model; then the work after the passes (the
optimizer's in proportion to the parameters the rank holds). Then the same simulation as every
other target (viz.whatif.replay.simulate). Memory: viz.whatif.pipeline.pp_memory.
"""
from __future__ import annotations

from tracer.vocab.schedules import schedule_actions

from ...analysis.crossrank.dimensions import WORLD
from ...analysis.timeline.metrics import metrics_of
from ..edits.edit import compute_in
from ..recorded.windows import GRAD_SYNC
from ..reference_gpt.targets import TargetError
from ..reference_gpt.torch_plans import torch_order
from ..replay.compose import Body, Call, Programs
from ..replay.graph import PassKey
from ..replay.measures import measures
from ..replay.models import work_of
from ..replay.simulate import SimulationError, as_timeline, simulate
from .pp_memory import PassAxis, pipeline_memory
from .pp_stages import boundary_bytes, stage_windows


def schedule_order(schedule: str, pp: int, rank: int, microbatches: int, chunks: int) -> list:
    """The rank's compute actions (kind, microbatch, chunk), in torch's order."""
    if schedule == "interleaved":
        return torch_order("interleaved", stages=pp, rank=rank, microbatches=microbatches,
                           chunks=chunks)
    return schedule_actions(schedule, stages=pp, rank=rank, microbatches=microbatches,
                            chunks=1)


class _StepParts:
    """One recorded step of a source rank cut for the pipeline: per stage the compute of its
    forward and backward of one micro-batch, the work before and after, each cut's bytes."""

    def __init__(self, rec, model, src: int, step: int, tgt, ratio: float):
        detail = model.details[src]
        windows = model.windows_of(src, step)
        nodes = model.nodes[src].get(step, [])
        micro = windows.micro[-1]
        self.spans = stage_windows(windows, micro, tgt.stages)
        self.cut_bytes = [round(b * ratio) for b in
                          boundary_bytes(detail.ops, step, self.spans, tgt.stages)]
        ops = detail.ops

        def part(lo: int, hi: int, scale: float) -> float:
            ns = compute_in(nodes, lo, hi) - _grad_sync_ns(ops, step, lo, hi)
            return max(ns, 0.0) * _factor(ops, rec.ops, scale, lo, hi, step, ns)
        self.forward = [part(lo, hi, ratio) for lo, hi in self.spans.forward]
        self.backward = [part(lo, hi, ratio) for lo, hi in self.spans.backward]
        lo, hi = windows.span
        self.pre_end, self.post_start = micro.forward[0], micro.autograd_end + 1
        self.pre = part(lo, self.pre_end, ratio * tgt.microbatches)
        self.post = compute_in(nodes, self.post_start, hi + 1)


def _grad_sync_ns(ops, step: int, lo: int, hi: int) -> float:
    """Time of the recorded data parallelism's ops (DDP's bucket copies) in [lo, hi)."""
    rows = (ops.step == step) & (ops.t0 >= lo) & (ops.t0 < hi) & (ops.phase == GRAD_SYNC)
    return float((ops.t1[rows] - ops.t0[rows]).sum())


def _factor(ops, cost, ratio: float, lo: int, hi: int, step: int, total: float) -> float:
    """How much longer the compute of [lo, hi) takes at ``ratio`` times the work: each op's
    time by the op-cost model (host time between ops unchanged)."""
    if ratio == 1.0 or total <= 0:
        return 1.0
    extra = 0.0
    rows = ((ops.step == step) & (ops.t0 >= lo) & (ops.t0 < hi)).nonzero()[0]
    for i in rows.tolist():
        name = ops.names[ops.op[i]]
        work = work_of(name, ops.shape_texts[ops.shapes[i]] if ops.shapes[i] >= 0 else None)
        extra += float(ops.t1[i] - ops.t0[i]) * (cost.ratio(name, work, work * ratio) - 1.0)
    return max(1.0 + extra / total, 0.0)


def predict_pipeline(rec, model, tgt, ratio: float) -> tuple:
    """(timeline, metrics, measures, memory, collectives, assumptions) of the target
    (``model``: the viz.whatif.model_predict.ModelRecording; ``ratio``: the micro-batch
    size's, target over recorded)."""
    pp, m = tgt.pp, tgt.microbatches
    chunks = len(tgt.stages) // pp
    programs = Programs(rec.graph.clock)
    memory, collectives = {}, {}
    link = _Link(rec)
    for rank in range(tgt.world):
        src = rank % rec.world
        if src not in model.details:
            raise TargetError(f"rank {src} of the recording has no readable trace: a "
                              "prediction needs every rank's steps")
        detail = model.details[src]
        order = schedule_order(tgt.schedule, pp, rank, m, chunks)
        steps = list(detail.steps)
        programs.start(rank)
        for index, step in enumerate([steps[0]] + steps):
            parts = _StepParts(rec, model, src, step, tgt, ratio)
            _emit(programs, rank, index, order, parts, tgt, link)
        parts = _StepParts(rec, model, src, steps[-1], tgt, ratio)
        collectives[str(rank)] = _rows(rank, order, parts.cut_bytes, tgt)
        if detail.memory_step == steps[-1] and detail.storages:
            windows = model.windows_of(src, steps[-1])
            passes = [(a.kind, a.microbatch, a.chunk * pp + rank) for a in order]
            axis = PassAxis(passes, parts.spans, parts.pre_end, parts.post_start)
            mine = sorted({s for _, _, s in passes})
            memory[str(rank)] = pipeline_memory(model.setup, tgt, model.layout, detail,
                                                windows, axis, mine, parts.cut_bytes, ratio)
    graph = programs.graph
    graph.config = tgt.config()
    graph.pipeline_groups = {r: tuple(range(pp)) for r in range(tgt.world)}
    try:
        sim = simulate(graph)
    except SimulationError as err:
        raise TargetError(str(err)) from None
    timeline = as_timeline(graph, sim, {})
    metrics = metrics_of(timeline)
    return (timeline, metrics, measures(metrics),
            memory if len(memory) == tgt.world else None, collectives,
            assumptions(model.setup, tgt, link))


class _Link:
    """A P2P message's time: the link model fitted on the recording's messages, else a
    two-rank all-reduce of its size less one of its two latencies (without the recorded
    all-reduces' jitter, which belongs to where they ran)."""

    def __init__(self, rec):
        self.rec = rec
        self.derived = not rec.link.fit.samples

    def __call__(self, nbytes: int) -> float:
        if not self.derived:
            return self.rec.link(nbytes)
        ns, _ = self.rec.collectives.time("all_reduce", 2, nbytes, "pp")
        return max(ns - 0.5 * self.rec.collectives.time("all_reduce", 2, 0, "pp")[0], 0.0)


def _emit(programs: Programs, rank: int, index: int, order: list, parts: _StepParts, tgt,
          link: _Link) -> None:
    """One step of ``rank``: the work before, the passes, the work after."""
    pp, last = tgt.pp, len(tgt.stages) - 1
    programs.step(rank, index)
    programs.work(rank, Body(parts.pre))
    for action in order:
        stage = action.chunk * pp + rank
        forward = action.kind == "F"
        body = Body(parts.forward[stage] if forward else parts.backward[stage])
        source = stage - 1 if forward else stage + 1      # whom its input comes from
        target = stage + 1 if forward else stage - 1      # whom its output goes to
        if 0 <= source <= last:
            nbytes = parts.cut_bytes[min(source, stage)]
            body.calls.append((0.0, Call("recv", (source % pp,), nbytes, link(nbytes), "pp",
                                         (index, action.kind, action.microbatch, stage), 0.0)))
        if 0 <= target <= last:
            nbytes = parts.cut_bytes[min(target, stage)]
            body.calls.append((body.compute, Call(
                "send", (target % pp,), nbytes, link(nbytes), "pp",
                (index, action.kind, action.microbatch, target))))
        programs.work(rank, body, PassKey(rank, index, action.kind, action.microbatch,
                                          action.chunk))
    programs.work(rank, Body(parts.post * _held_share(tgt, rank)))


def _held_share(tgt, rank: int) -> float:
    """The share of the model's stages a rank runs (the optimizer's work after the passes)."""
    return len([s for s in range(len(tgt.stages)) if s % tgt.pp == rank]) / len(tgt.stages)


def _rows(rank: int, order: list, cut_bytes: list, tgt) -> list:
    """summary.json's comm rows of one step of ``rank``: its sends and receives."""
    pp, last = tgt.pp, len(tgt.stages) - 1
    group = list(range(tgt.world))
    counts: dict = {}
    for action in order:
        stage = action.chunk * pp + rank
        phase = "forward" if action.kind == "F" else "backward"
        source, target = (stage - 1, stage + 1) if action.kind == "F" else (stage + 1, stage - 1)
        for kind, peer in (("recv", source), ("send", target)):
            if 0 <= peer <= last:
                key = (kind, phase)
                count, nbytes = counts.get(key, (0, 0))
                counts[key] = (count + 1, nbytes + cut_bytes[min(peer, stage)])
    dimension = WORLD if len(group) == tgt.world else "pp"
    return [{"kind": kind, "phase": phase, "group": group, "dimension": dimension,
             "count": count, "bytes": nbytes}
            for (kind, phase), (count, nbytes) in sorted(counts.items())]


def assumptions(rec, tgt, link: _Link) -> list:
    """What a pipeline prediction took for granted (docs/whatif.md)."""
    out = [f"recorded: {rec.describe()}; predicted: {tgt.describe()}",
           "torch.distributed.pipelining: stage i on rank i mod pp, no data parallelism; each "
           "stage's forward and backward of a micro-batch cost their windows of the recorded "
           "micro-batch (compute and host time between ops); the runtime's own host time per "
           "pass (splitting, P2P set-up) not modelled",
           "one activation crosses each cut (the next stage's first op's first input, its "
           "recorded shape) and its gradient back, each a P2P message a micro-batch; the "
           "step's data made at once for all micro-batches on every rank",
           "memory: torch.distributed.pipelining's receive buffers (one a micro-batch and "
           "direction, kept across steps), the last stage's outputs (kept until the next "
           "step, merged after the last pass) and the lifetimes its schedules give what a "
           "stage sends (torch 2.10 to 2.14.1 alike, docs/whatif.md)"]
    if link.derived:
        out.append("P2P messages: no P2P recorded; a message costs a two-rank all-reduce of "
                   "its size less one of its two latencies (the all-reduce's alpha-beta fit)")
    if tgt.microbatch_size != rec.microbatch_size:
        out.append(f"micro-batch size {rec.microbatch_size} -> {tgt.microbatch_size}: each "
                   "op's time by the op-cost model at its work times the ratio, activations "
                   "and temporaries in proportion")
    return out
