"""Megatron's rules, as the reference GPT follows them (docs/oracles.md): which module of a
layer is sharded by tensor parallelism, the tensor-parallel collectives of each pass, the
parameters (and so the gradient buckets) a rank holds, and which role a process group plays
for a rank.

Module paths are the reference GPT's (``GPTChunk.blocks.<layer>.attn.qkv``, ``.embedding``,
``.head``): a layer's blocks are keyed by their global index, so a path names its layer on any
stage. Sizes are elements unless a name says bytes; float32 (4 bytes) as the reference GPT
trains.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ...analysis.timeline.grid import Grid

BYTES = 4                          # float32
DEFAULT_BUCKET = 16_384            # sample_runs' --bucket-size default (elements)
_TP_LEAVES = ("qkv", "proj", "fc1", "fc2", "attn", "mlp")   # split over the TP group
_SP_LEAVES = ("ln1", "ln2", "ln_f")                        # sequence-sharded under SP


@dataclass(frozen=True)
class Shape:
    """The model and parallel layout a prediction needs (the recorded config's keys)."""

    layers: int
    hidden: int
    seq_len: int
    vocab: int
    micro_batch_size: int
    tp: int = 1
    sp: bool = False
    pp: int = 1
    dp: int = 1
    virtual_stages: int = 1
    microbatches: int = 1
    schedule: str = "1f1b"
    bucket_size: int = DEFAULT_BUCKET

    @property
    def grid(self) -> Grid:
        return Grid(tp=self.tp, dp=self.dp, pp=self.pp)

    @property
    def stages(self) -> int:
        return self.pp * self.virtual_stages

    @property
    def sequence_parallel(self) -> bool:
        return self.sp and self.tp > 1

    def layers_of(self, virtual_stage: int) -> range:
        per = self.layers // self.stages
        return range(virtual_stage * per, (virtual_stage + 1) * per)

    def virtual_stage(self, pp_rank: int, chunk: int) -> int:
        return chunk * self.pp + pp_rank

    @property
    def activation_bytes(self) -> int:
        """One P2P message: (s[/t], b, h)."""
        s = self.seq_len // self.tp if self.sequence_parallel else self.seq_len
        return s * self.micro_batch_size * self.hidden * BYTES


def shape_of(config: dict) -> Optional[Shape]:
    """The Shape of a recorded config, or None when it lacks the model's sizes."""
    try:
        return Shape(layers=int(config["layers"]), hidden=int(config["hidden"]),
                     seq_len=int(config["seq_len"]), vocab=int(config["vocab"]),
                     micro_batch_size=int(config["micro_batch_size"]),
                     tp=int(config.get("tp") or 1), sp=bool(config.get("sp")),
                     pp=int(config.get("pp") or 1), dp=int(config.get("dp") or 1),
                     virtual_stages=int(config.get("virtual_stages") or 1),
                     microbatches=int(config.get("microbatches") or 1),
                     schedule=str(config.get("schedule") or "1f1b"),
                     bucket_size=int(config.get("bucket_size") or DEFAULT_BUCKET))
    except (KeyError, TypeError, ValueError):
        return None


# ---------------------------------------------------------------------------- modules
def module_part(module: Optional[str]) -> tuple:
    """(part, layer): ("layer", i), ("embedding", None), ("head", None) or ("other", None)."""
    if not module:
        return "other", None
    parts = module.split(".")
    if "blocks" in parts:
        i = parts.index("blocks")
        if i + 1 < len(parts) and parts[i + 1].isdigit():
            return "layer", int(parts[i + 1])
    if "embedding" in parts:
        return "embedding", None
    if "head" in parts:
        return "head", None
    return "other", None


def shard_factor(module: Optional[str], shape: Shape, target: Shape) -> float:
    """How much of an op's work a rank keeps when TP goes from ``shape``'s to ``target``'s:
    column- and row-parallel linears, attention heads and the MLP's activation split by t;
    LayerNorms and residual adds by t under sequence parallelism only; the LM head and the
    vocab-parallel loss by t (vocabulary); the embedding lookup and the rest not at all."""
    if not module:
        return 1.0
    parts = module.split(".")
    leaf = parts[-1]
    old_t, new_t = shape.tp, target.tp
    if leaf in _TP_LEAVES or (leaf == "head" and parts[-2:] != ["head", "ln_f"]):
        return old_t / new_t
    if leaf in _SP_LEAVES or (len(parts) >= 2 and parts[-2] == "blocks"):
        old = old_t if shape.sequence_parallel else 1
        new = new_t if target.sequence_parallel else 1
        return old / new
    return 1.0


# ---------------------------------------------------------------------------- collectives
@dataclass(frozen=True)
class TPCall:
    """One tensor-parallel collective of a pass: kind, bytes a rank hands in, where in the
    pass (the part it belongs to and its place among the part's calls)."""

    kind: str
    nbytes: int
    part: str                 # "embedding" | "layer" | "head"
    layer: Optional[int] = None


def tp_calls(shape: Shape, kind: str, layers: range, first: bool, last: bool) -> list:
    """The TP collectives of one F, B or W pass through ``layers`` (docs/oracles.md, Megatron):
    none with t = 1. Without SP: 2 all-reduces of s*b*h per layer each way, 1 for the
    embedding (forward), 3 of s*b for the vocab-parallel loss (forward), 1 for the LM head
    (backward). With SP: per layer 2 all-gathers of the shard and 2 reduce-scatters of the
    full activation forward; backward 2 reduce-scatters and 4 all-gathers (2 re-gather the
    column-parallel inputs for their weight gradients: in W under ZB-H1); the embedding's
    all-reduce and its scatter's all-gather backward; the head's gather and its
    reduce-scatter backward, and its weight gradient's re-gather."""
    t = shape.tp
    if t < 2:
        return []
    full = shape.seq_len * shape.micro_batch_size * shape.hidden * BYTES
    shard = full // t
    tokens = shape.seq_len * shape.micro_batch_size * BYTES
    sp = shape.sequence_parallel
    out: list = []
    if kind == "F":
        if first:
            out.append(TPCall("all_reduce", full, "embedding"))
        for i in layers:
            out += [TPCall("all_gather", shard, "layer", i), TPCall("reduce_scatter", full,
                                                                   "layer", i),
                    TPCall("all_gather", shard, "layer", i), TPCall("reduce_scatter", full,
                                                                   "layer", i)] if sp else \
                [TPCall("all_reduce", full, "layer", i), TPCall("all_reduce", full, "layer", i)]
        if last:
            out += ([TPCall("all_gather", shard, "head")] if sp else []) + \
                [TPCall("all_reduce", tokens, "head")] * 3
        return out
    if kind == "W":
        return [TPCall("all_gather", shard, "layer", i) for i in reversed(layers)
                for _ in range(2)] if sp else []
    split_w = shape.schedule == "zb-h1"
    if last:
        out += [TPCall("all_gather", shard, "head"), TPCall("reduce_scatter", full, "head")] \
            if sp else [TPCall("all_reduce", full, "head")]
    for i in reversed(layers):
        if sp:
            regather = [] if split_w else [TPCall("all_gather", shard, "layer", i)]
            out += [TPCall("all_gather", shard, "layer", i)] + regather + \
                [TPCall("reduce_scatter", full, "layer", i)]
            out += [TPCall("all_gather", shard, "layer", i)] + regather + \
                [TPCall("reduce_scatter", full, "layer", i)]
        else:
            out += [TPCall("all_reduce", full, "layer", i)] * 2
    if first and sp:
        out.append(TPCall("all_gather", shard, "embedding"))
    return out


# ---------------------------------------------------------------------------- parameters
def layer_params(shape: Shape) -> list:
    """A block's parameters on one TP rank, in creation order: (elements, sequence-parallel)."""
    h, t = shape.hidden, shape.tp
    sp = shape.sequence_parallel
    return [(h, sp), (h, sp), (3 * h * h // t, False), (3 * h // t, False), (h * h // t, False),
            (h, sp), (h, sp), (h, sp), (4 * h * h // t, False), (4 * h // t, False),
            (4 * h * h // t, False), (h, sp)]


def rank_params(shape: Shape, pp_rank: int) -> list:
    """Every parameter of a pipeline rank, in creation order (chunk by chunk: embedding,
    blocks, head): (elements, sequence-parallel)."""
    h, t = shape.hidden, shape.tp
    out: list = []
    for chunk in range(shape.virtual_stages):
        vs = shape.virtual_stage(pp_rank, chunk)
        first, last = vs == 0, vs == shape.stages - 1
        if first:
            out += [(shape.vocab * h // t, False), (shape.seq_len * h, False)]
        for _ in shape.layers_of(vs):
            out += layer_params(shape)
        if last:
            out += [(h, shape.sequence_parallel), (h, shape.sequence_parallel)]
            if not first:
                out.append((shape.vocab * h // t, False))
    return out


def chunk_elements(shape: Shape, pp_rank: int) -> list:
    """Parameter elements of each of the rank's chunks."""
    one = Shape(**{**shape.__dict__, "virtual_stages": 1, "pp": shape.stages})
    return [sum(n for n, _ in rank_params(one, shape.virtual_stage(pp_rank, c)))
            for c in range(shape.virtual_stages)]


def buckets(shape: Shape, pp_rank: int) -> list:
    """(elements, chunk, fraction) of each data-parallel gradient bucket, in launch order:
    sample_runs.parallel.data_parallel.partition_buckets over the reversed parameters; a
    bucket launches once its parameters have their last gradient, at ``fraction`` of the
    last backward pass of ``chunk`` (backward runs the chunk's parameters in reverse)."""
    params, owner = [], []
    one = Shape(**{**shape.__dict__, "virtual_stages": 1, "pp": shape.stages})
    for chunk in range(shape.virtual_stages):
        mine = rank_params(one, shape.virtual_stage(pp_rank, chunk))
        params += [n for n, _ in mine]
        owner += [chunk] * len(mine)
    return _bucket_list(params, owner, chunk_elements(shape, pp_rank), shape.bucket_size)


def _bucket_list(params: list, owner: list, chunks: list, bucket: int) -> list:
    out, size, done = [], 0, {c: 0 for c in range(len(chunks))}
    where = (0, 0.0)
    for n, chunk in zip(reversed(params), reversed(owner)):
        if size and size >= bucket:
            out.append((size,) + where)
            size = 0
        size += n
        done[chunk] += n
        where = (chunk, done[chunk] / max(chunks[chunk], 1))
    if size:
        out.append((size,) + where)
    return out


def sp_grad_elements(shape: Shape, pp_rank: int) -> int:
    """Elements of the sequence-parallel parameters' gradients all-reduced over TP once per
    iteration (LayerNorms, row-parallel biases): 0 without SP."""
    if not shape.sequence_parallel:
        return 0
    return sum(n for n, sp in rank_params(shape, pp_rank) if sp)


def tied_elements(shape: Shape) -> int:
    """The word embedding's gradient all-reduced between the first and last stage."""
    return shape.vocab * shape.hidden // shape.tp if shape.pp > 1 else 0


# ---------------------------------------------------------------------------- roles
def roles(grid: Grid, rank: int) -> dict:
    """role -> the group (ranks) of that role for ``rank``, in the reference GPT's grid."""
    tp, cp, dp, pp = grid.coords(rank)
    out = {"tp": tuple(grid.rank(i, cp, dp, pp) for i in range(grid.tp)),
           "dp": tuple(grid.rank(tp, cp, i, pp) for i in range(grid.dp)),
           "pp": grid.pipeline(rank)}
    if grid.pp > 1:
        pipe = grid.pipeline(rank)
        out["embedding"] = (pipe[0], pipe[-1])
    return out


def role_of(group: tuple, mine: dict) -> str:
    """The role of a group for a rank (``mine`` from :func:`roles`): tp, dp, embedding, pp,
    self (a group of one) or other."""
    group = tuple(sorted(group))
    if len(group) <= 1:
        return "self"
    for role in ("tp", "dp", "embedding", "pp"):
        if role in mine and tuple(sorted(mine[role])) == group:
            return role
    return "other"
