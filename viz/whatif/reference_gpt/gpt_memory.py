"""What-if memory: each target rank's peak, by category, from a recording made with memory
(the default; viz.analysis.memory) and Megatron's rules (:mod:`.megatron`).

- **Model states** follow the parameter elements a rank holds (:func:`.megatron.rank_params`):
  the recording gives the bytes of parameters, gradients and optimizer state (each one's own
  peak) per element a rank holds (fp32 AdamW: 4, 4 and 8, plus AdamW's step tensors); a target
  rank holds its own elements times the recording's mean of each. GPipe's peak comes when
  every forward is done and no backward has run: no gradients then (the reference GPT sets
  them to None at each step's start).
- **Activations** follow the micro-batches a stage holds at its peak (docs/oracles.md,
  "Memory per rank"): GPipe all m; 1F1B and ZB-H1 min(m, p - r); interleaved 1F1B (v chunks)
  min(m v, 2 (p - r - 1) + (v - 1) p + 1) chunks. One micro-batch of one layer keeps
  s b h (4 + 12 / t) elements without sequence parallelism and 16 s b h / t with it
  (Korthikanti et al. 2022 less the dropout masks; the fused attention keeps no 5 a s / h
  scores); the recording gives the bytes of a unit (its activations at each rank's peak over
  the units it held, which also carries the stage's embedding or head). Dropout's masks are
  not modelled.
- **Temporaries and communication buffers** at the peak: the recording's mean, scaled as one
  micro-batch of one layer is.
- **ZB-H1's weight-gradient store**: stage r runs its W passes up to r micro-batches late
  (tracer.vocab.schedules.zb_h1), and each pending W keeps every linear layer's input (an
  activation, saved in the forward) and output gradient (a temporary) on top of the 1F1B
  micro-batches (:func:`w_store`). A ZB-H1 recording has them taken out before the fit.

The peak is the sum of the categories: it takes them at their largest together, as the
recording's peaks mostly do. What it leaves out: the allocator's rounding.
"""
from __future__ import annotations

from typing import Optional

from .megatron import BYTES, Shape, rank_params

MODEL_STATES = ("parameters", "gradients", "optimizer_state")
WORKING = ("temporaries", "comm")


def in_flight(shape: Shape, pp_rank: int) -> float:
    """Layers' worth of micro-batches stage ``pp_rank`` holds at its peak (micro-batches
    times the layers of each, per its chunks)."""
    m, p, v = shape.microbatches, shape.pp, shape.virtual_stages
    per_chunk = shape.layers / shape.stages
    if shape.schedule == "gpipe":
        return m * v * per_chunk
    if shape.schedule == "interleaved" and v > 1:
        return min(m * v, 2 * (p - pp_rank - 1) + (v - 1) * p + 1) * per_chunk
    return min(m, p - pp_rank) * v * per_chunk


def stage_role(pp: int, pp_rank: int) -> str:
    """``only`` (no pipeline), ``first``, ``last`` or ``middle``."""
    if pp == 1:
        return "only"
    return "first" if pp_rank == 0 else "last" if pp_rank == pp - 1 else "middle"


def unit(shape: Shape) -> float:
    """One micro-batch of one layer's activations, in elements: the reference GPT's block
    keeps s b h (4 + 12/t), or 16 s b h / t with SP (docs/oracles.md: Korthikanti et al.'s
    count less the dropout masks, halved from fp16 bytes)."""
    sbh = shape.seq_len * shape.micro_batch_size * shape.hidden
    t = shape.tp
    return sbh * 16 / t if shape.sequence_parallel else sbh * (4 + 12 / t)


def w_pending(shape: Shape, pp_rank: int) -> int:
    """Micro-batches whose W pass is still pending on stage ``pp_rank`` at its peak (the last
    forward of 1F1B's steady state): ZB-H1 keeps up to r of them; other schedules none."""
    if shape.schedule != "zb-h1":
        return 0
    m, p, r = shape.microbatches, shape.pp, pp_rank
    warmup = min(p - r - 1, m)
    return max(0, min(r, m - warmup - 1))


def w_store(shape: Shape) -> dict:
    """Bytes one pending W pass keeps on a stage, by category: each linear layer's input
    (activations; qkv and fc1 take the block's (s[/t], b, h), proj (s, b, h/t), fc2
    (s, b, 4h/t)) and output gradient (temporaries; qkv (s, b, 3h/t), proj (s, b, h), fc1
    (s, b, 4h/t), fc2 (s, b, h)), and one received message buffer (s[/t], b, h) of the stage
    (an activation; measured on the recordings, docs/whatif.md). The head's weight gradient
    is never deferred."""
    sbh, t = shape.seq_len * shape.micro_batch_size * shape.hidden, shape.tp
    inputs = sbh * 7 / t if shape.sequence_parallel else sbh * (2 + 5 / t)
    grads = sbh * (2 + 7 / t)
    layers = shape.layers / shape.stages
    return {"activations": layers * inputs * BYTES + shape.activation_bytes,
            "temporaries": layers * grads * BYTES}


def elements(shape: Shape, pp_rank: int) -> int:
    return sum(n for n, _ in rank_params(shape, pp_rank))


class MemoryModel:
    """Fitted once on a recording: per parameter element, the model states' bytes; per unit,
    the activations'; the working set per unit."""

    def __init__(self, shape: Shape, grid, peaks: dict, own: dict):
        """``peaks``: rank -> what was live at its peak, category -> bytes; ``own``: rank ->
        each category's own peak (the model states', whatever the schedule's peak held)."""
        sums = {c: 0.0 for c in MODEL_STATES + ("activations",) + WORKING}
        held = 0.0
        by_role: dict = {}         # role -> [activation bytes, units]
        kept = w_store(shape)      # what a pending ZB-H1 W pass keeps, taken out of the fit
        for rank, at in peaks.items():
            pp_rank = grid.coords(rank)[3] if grid is not None else 0
            at = {c: b - w_pending(shape, pp_rank) * kept.get(c, 0) for c, b in at.items()}
            held += elements(shape, pp_rank)
            role = by_role.setdefault(stage_role(shape.pp, pp_rank), [0.0, 0.0])
            role[0] += at.get("activations", 0)
            role[1] += in_flight(shape, pp_rank) * unit(shape)
            for c in sums:
                sums[c] += (own[rank] if c in MODEL_STATES else at).get(c, 0)
        self.per_element = {c: sums[c] / held if held else 0.0 for c in MODEL_STATES}
        # bytes per unit, per stage role: the first stage also keeps the embedding's, the
        # last the head's (its logits), one stage both
        self.per_unit = {role: b / u for role, (b, u) in by_role.items() if u}
        count = len(peaks) or 1
        self.working = {c: sums[c] / count / unit(shape) for c in WORKING}

    def _per_unit(self, role: str) -> float:
        """A role's bytes per unit; one the recording lacks: the mean of those it has (the
        first and last for a single stage)."""
        if role in self.per_unit:
            return self.per_unit[role]
        have = [self.per_unit[r] for r in ("first", "last") if r in self.per_unit] or \
            list(self.per_unit.values())
        return sum(have) / len(have) if have else 0.0

    def predict(self, target: Shape, pp_rank: int) -> dict:
        """Category -> bytes live at a target rank's peak, and ``peak_bytes``, their sum."""
        n = elements(target, pp_rank)
        out = {c: round(n * self.per_element[c]) for c in MODEL_STATES}
        if target.schedule == "gpipe":     # its peak, every forward done, precedes any backward
            out["gradients"] = 0
        out["activations"] = round(in_flight(target, pp_rank) * unit(target)
                                   * self._per_unit(stage_role(target.pp, pp_rank)))
        out.update({c: round(self.working[c] * unit(target)) for c in WORKING})
        pending = w_pending(target, pp_rank)
        for c, b in w_store(target).items():
            out[c] += round(pending * b)
        return {"peak_bytes": sum(out.values()), "by_category": out}


def recorded_peaks(analysis) -> dict:
    """rank -> what was live at its peak by category, for the ranks with memory recorded."""
    return {r: dict(mine.memory.at_peak["category"]) for r, mine in analysis.ranks.items()
            if mine.memory is not None}


def memory_model(analysis, shape: Optional[Shape], grid) -> Optional[MemoryModel]:
    """The fitted model, or None: memory not recorded, or no model sizes in the config."""
    peaks = recorded_peaks(analysis)
    if not peaks or shape is None:
        return None
    own = {r: analysis.ranks[r].memory.category_peaks for r in peaks}
    return MemoryModel(shape, grid, peaks, own)


def predicted(model: Optional[MemoryModel], target: Optional[Shape]) -> Optional[dict]:
    """whatif.json's ``memory`` of a target: rank -> {peak_bytes, by_category}; None without
    a model."""
    if model is None or target is None:
        return None
    grid = target.grid
    return {str(rank): model.predict(target, grid.coords(rank)[3])
            for rank in range(grid.world)}
