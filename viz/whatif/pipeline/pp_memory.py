"""A pipeline rank's peak memory by category (``--pp N --split ...`` on any model), replayed
from the storages of a recorded step without a pipeline (viz.analysis.step_detail):

- the model's working storages of each stage the rank runs, taken from the stage's windows of
  the recorded micro-batch (viz.whatif.pipeline.pp_stages), one copy per micro-batch at that
  micro-batch's pass in the schedule's order (a :class:`PassAxis`), scaled by the micro-batch size;
  what a stage hands on (its output) and hands back (its input's gradient) lives as long as
  torch.distributed.pipelining keeps it (viz.whatif.pipeline.pp_runtime), and on the stage that
  made it is a temporary unless that stage's own backward freed it (saved it);
- the data of a step (made before the first forward) on every rank, for all micro-batches;
- torch.distributed.pipelining's receive buffers and the last stage's outputs
  (viz.whatif.pipeline.pp_runtime);
- the model states of the stages' modules: parameters and buffers (the root's own on every
  rank), gradients from where the recording made them in the first micro-batch's backward to
  the next step's ``zero_grad``, optimizer state by the recorded bytes per element, its
  temporaries in proportion.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Optional

from tracer.vocab.model_paths import model_path

from ..memory.memory_replay import Life, StatesModel, peak
from ..memory.working_memory import gradient_storages, scaled, working
from ..recorded.layout import Layout
from ..recorded.windows import BACKWARD
from .pp_runtime import (input_grad_freed, last_stage_outputs, output_freed,
                         receive_buffers)
from .pp_stages import StageCut, StageWindows


class PassAxis:
    """Positions ``(segment, recorded time, order)`` on a pipeline rank's step: segment 0 before
    its first pass, one a pass in the schedule's order, the last after its passes; a pass's
    times are those of its stage's window of the recorded micro-batch."""

    def __init__(self, passes: list, spans: StageWindows, pre_end: int, post_start: int):
        self.index = {key: k + 1 for k, key in enumerate(passes)}    # (kind, mb, stage)
        self.spans = spans
        self.pre_end, self.post_start = pre_end, post_start
        self.last = len(passes) + 1

    def at(self, kind: str, microbatch: int, stage: int, t: int, order: float = 0) -> tuple:
        return (self.index[(kind, microbatch, stage)], t, order)

    def end(self, kind: str, microbatch: int, stage: int) -> tuple:
        """Just after the pass's last op."""
        span = (self.spans.forward if kind == "F" else self.spans.backward)[stage]
        return (self.index[(kind, microbatch, stage)], span[1], 50)

    def post(self, order: float = 0) -> tuple:
        return (self.last, self.post_start, order)

    def first_pass(self) -> tuple:
        """When the schedule's ``step`` begins: after the work before the first pass."""
        return (0, self.pre_end, 100)

    def outside(self, t: Optional[int], order: float = 0) -> Optional[tuple]:
        """Recorded time ``t`` outside the passes: before them, after them; one inside them
        (data the recorded forward freed) at the schedule's start; None stays None."""
        if t is None:
            return None
        if t < self.pre_end:
            return (0, t, order)
        if t >= self.post_start:
            return (self.last, t, order)
        return self.first_pass()


def pipeline_memory(rec, tgt, layout: Layout, detail, windows, axis: PassAxis,
                    mine: list, cut_bytes: list, batch: float) -> dict:
    """``{"peak_bytes", "by_category"}`` of a pipeline rank running stages ``mine`` of
    ``tgt.stages`` (``rec``, ``tgt``: the recorded and target viz.whatif.recorded.setup.Setup;
    ``detail``: the step detail of the recorded rank it takes its work from, ``windows`` its
    memory step's; ``cut_bytes``: each cut's activation, one micro-batch of the target)."""
    stages: StageCut = tgt.stages
    grads = gradient_storages(detail.storages, rec, layout)
    works = scaled(working(detail.storages, rec, grads), batch, 1.0)
    spans = axis.spans
    outputs = _outputs(works, spans, stages)
    grads_back = _handed_back(works, spans)
    last = len(stages) - 1
    unsaved = _unsaved_data(works, axis, 0 in mine, last in mine)
    lives: list = []
    for w in works:
        if id(w) in unsaved:
            w = replace(w, category="temporaries")
        lives += _placed(w, tgt, axis, mine, outputs, grads_back, last)
    for s in mine:
        before = outputs.get(s - 1)
        lives += receive_buffers(s, len(stages), tgt.microbatches,
                                 cut_bytes[s - 1] if s > 0 else 0,
                                 cut_bytes[s] if s < last else 0,
                                 before.category if before is not None else "activations")
    if last in mine and last in outputs:
        out = outputs[last]
        lives += last_stage_outputs(axis, tgt.microbatches, out.nbytes, out.category)
    lives += _states(rec, tgt, layout, detail, windows, axis, mine, grads)
    return peak(lives)


def _outputs(works: list, spans: StageWindows, stages: StageCut) -> dict:
    """stage -> the working storage its forward hands on: the last one its last item made
    (the last stage's: the model's output)."""
    out = {}
    for s, items in enumerate(stages.stages):
        lo, hi = spans.forward[s]
        made = [w for w in works if w.start is not None and lo <= w.start < hi and w.module
                and _under(model_path(w.module), items[-1])]
        if made:
            out[s] = max(made, key=lambda w: w.start)
    return out


def _unsaved_data(works: list, axis: PassAxis, first: bool, last: bool) -> set:
    """ids of the step's data no stage of this rank saves: of the data saved for backward,
    the first made (the model's input) is the first stage's, the others (the targets) the
    last stage's; the previous step's, freed in this step, likewise."""
    out = set()
    for carried in (True, False):
        data = [w for w in works if w.phase == "other" and w.category == "activations" and
                (w.start is None) == carried and (carried or w.start < axis.pre_end)]
        data.sort(key=lambda w: (w.end if carried else w.start) or 0)
        for i, w in enumerate(data):
            if not (first if i == 0 else last):
                out.add(id(w))
    return out


def _handed_back(works: list, spans: StageWindows) -> set:
    """ids of the working storages each stage but the first hands back: the last one its
    backward made that outlives it (the gradient of its input)."""
    out = set()
    for lo, hi in spans.backward[1:]:
        made = [w for w in works if w.start is not None and lo <= w.start < hi and
                (w.end is None or w.end >= hi)]
        if made:
            out.add(id(max(made, key=lambda w: w.start)))
    return out


def _under(path: str, item: str) -> bool:
    return path == item or path.startswith(item + ".")


def _placed(w, tgt, axis: PassAxis, mine: list, outputs: dict, grads_back: set,
            last: int) -> list:
    """The lives of one recorded working storage on this rank: a copy per micro-batch."""
    m = tgt.microbatches
    if w.start is None or w.start < axis.pre_end:
        if w.phase == "other":           # the step's data: made at once for every micro-batch
            return [Life(w.category, round(w.nbytes * m), axis.outside(w.start, w.born_order),
                         axis.outside(w.end, w.freed_order))]
        if w.start is None and last in mine:     # the last step's loss
            return [Life(w.category, w.nbytes, None, axis.first_pass())]
        return []
    if w.start >= axis.post_start:
        return [Life(w.category, w.nbytes, axis.outside(w.start, w.born_order),
                     axis.outside(w.end, w.freed_order))]
    where = axis.spans.stage_at(w.start) or (last, "F")
    stage, kind = where
    if stage not in mine:
        return []
    out = []
    for mb in range(m):
        category, freed = _freed(w, tgt, axis, stage, kind, mb, outputs, last)
        if id(w) in grads_back:
            freed = input_grad_freed(axis, tgt.schedule, stage, mb, m)
        out.append(Life(category, w.nbytes, axis.at(kind, mb, stage, w.start, w.born_order),
                        freed))
    return out


def _freed(w, tgt, axis: PassAxis, stage: int, kind: str, mb: int, outputs: dict,
           last: int) -> tuple:
    """(category, where it is freed) of a copy of a working storage made in ``stage``'s pass
    ``kind`` of micro-batch ``mb``."""
    if outputs.get(stage) is w and stage == last:
        return w.category, None               # output_chunks keeps it (pp_runtime)
    ended = axis.spans.stage_at(w.end) if w.end is not None else None
    if ended == (stage, kind):
        return w.category, axis.at(kind, mb, stage, w.end, w.freed_order)
    if kind == "F" and stage < last and outputs.get(stage) is w:
        release = output_freed(axis, tgt.schedule, stage, last + 1, mb, tgt.microbatches)
        if ended == (stage, "B"):             # its own stage saved it too
            return w.category, max(release, axis.at("B", mb, stage, w.end, w.freed_order))
        return "temporaries", release
    if kind == "F" and ended == (stage, "B"):
        return w.category, axis.at("B", mb, stage, w.end, w.freed_order)
    if kind == "F" and ended is not None and ended[1] == "F":     # a transient, freed late
        return w.category, axis.end("F", mb, stage)
    if kind == "F":
        return w.category, axis.end("B", mb, stage) if stage < last else axis.post(-45)
    if w.end is not None and w.end >= axis.post_start:
        return w.category, axis.outside(w.end, w.freed_order)
    return w.category, axis.end(kind, mb, stage)        # freed as the pass returns


def _states(rec, tgt, layout: Layout, detail, windows, axis: PassAxis, mine: list,
            grads: dict) -> list:
    """Parameters, buffers, gradients, optimizer state and temporaries of the rank's stages."""
    stages: StageCut = tgt.stages

    def copies(module: str) -> int:
        """How many of the rank's stage modules hold what ``module`` holds: the root's own
        parameters and buffers are in each (a stage is a copy of the model, cut)."""
        s = stages.stage_of(module)
        return len(mine) if s is None else int(s in mine)
    params = [p for p in layout.params for _ in range(copies(p.module))]
    lives = [Life("parameters", b.nbytes, None, None) for b in layout.buffers
             for _ in range(copies(b.module))]
    lives += [Life("parameters", p.nbytes, None, None) for p in params]
    model = StatesModel(detail.storages, rec, layout, detail.rank)
    elements = sum(p.numel for p in params if p.trainable)
    lives.append(Life("optimizer_state", round(model.per_element * elements), None, None))
    ratio = elements / model.held if model.held else 1.0
    for s in model.optimizer_temps:
        lives.append(Life("temporaries", round(s.nbytes * ratio), axis.outside(s.start),
                          axis.outside(s.end)))
    zero = (0, model.zero_grad, 0) if model.zero_grad is not None and \
        model.zero_grad < axis.pre_end else axis.first_pass()
    for p in params:
        if not p.trainable:
            continue
        stage = stages.stage_of(p.module)
        stage = mine[-1] if stage is None else stage
        lives.append(Life("gradients", p.nbytes, None, zero))
        for mb in range(tgt.microbatches):
            at = _ready(p, grads, windows, axis, stage, mb)
            lives.append(Life("gradients", p.nbytes, at, None) if mb == 0 else
                         Life("temporaries", p.nbytes, at, at[:2] + (at[2] + 1,)))
    return lives


def _ready(p, grads: dict, windows, axis: PassAxis, stage: int, mb: int) -> tuple:
    """Where parameter ``p``'s gradient is ready in micro-batch ``mb``'s backward of its
    stage: where the recording made it, else its module's backward end."""
    lo, hi = axis.spans.backward[stage]
    made = grads.get(p.name)
    if made is not None and lo <= made.start < hi:
        return axis.at("B", mb, stage, made.start)
    runs = [r for r in windows.of(BACKWARD, p.module) if lo <= r[0] < hi]
    return axis.at("B", mb, stage, runs[-1][1]) if runs else axis.end("B", mb, stage)

