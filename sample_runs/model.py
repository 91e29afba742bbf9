"""GPT-2-style decoder (nanoGPT's shape) built from tensor-parallel layers.

Embeddings, pre-LN blocks with causal self-attention and a GELU MLP, a final LayerNorm and an
LM head tied to the word embedding. A pipeline stage holds a GPTChunk: a contiguous range of
blocks, plus the embedding on the first chunk and the head and loss on the last. Every
parameter is sliced from a full tensor drawn from a generator seeded by (seed, full name), so
every parallel layout starts from the single-process weights. Activations are [s, b, h]
([s/c, b, h] with context parallelism: this rank's load-balanced chunks of the sequence).
With ``moe_experts`` > 0 every block's MLP is a mixture of experts (expert_parallel.py).
"""
from __future__ import annotations

import dataclasses
import math
import zlib
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from sample_runs.parallel.context_parallel import ContextParallel, ring_attention
from sample_runs.parallel.expert_parallel import ExpertParallel, MixtureOfExperts
from sample_runs.parallel.tensor_parallel import (
    ColumnParallelLinear, RowParallelLinear, ShardInfo, TensorParallel, VocabParallelEmbedding,
    column_parallel_linear, sharded_parameter, vocab_parallel_cross_entropy)
from sample_runs.parallel.tp_communications import scatter_to_sequence_parallel_region


@dataclass(frozen=True)
class GPTConfig:
    layers: int = 4
    hidden: int = 64
    heads: int = 4
    seq_len: int = 64
    vocab: int = 256
    dropout: float = 0.0
    moe_experts: int = 0  # 0: dense MLPs
    moe_topk: int = 2
    capacity_factor: float = 1.25
    aux_loss_coeff: float = 0.01


def full_weight(name: str, shape: tuple[int, ...], *, seed: int, std: float) -> torch.Tensor:
    """The single-process value of parameter ``name``: N(0, std^2) from its own generator,
    so it does not depend on which other parameters this rank builds."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    return torch.randn(shape, generator=gen) * std


def _dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    # NOTE: skipped at p=0 so that traces of the default run hold no no-op dropout kernels.
    return F.dropout(x, p, training) if p > 0 else x


class LayerNorm(nn.Module):
    """Replicated LayerNorm; under SP it normalises a sequence shard."""

    def __init__(self, name: str, hidden: int, tp: TensorParallel):
        super().__init__()
        sp = tp.sequence_parallel
        self.weight = sharded_parameter(
            torch.ones(hidden), ShardInfo(f"{name}.weight", (hidden,), sequence_parallel=sp), tp.group)
        self.bias = sharded_parameter(
            torch.zeros(hidden), ShardInfo(f"{name}.bias", (hidden,), sequence_parallel=sp), tp.group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    """Heads split over TP ranks: column-parallel fused QKV, row-parallel output projection.
    With context parallelism, ring attention over the keys/values of the other CP ranks."""

    def __init__(self, cfg: GPTConfig, name: str, tp: TensorParallel, seed: int,
                 cp: Optional[ContextParallel] = None):
        super().__init__()
        h = cfg.hidden
        proj_std = 0.02 / math.sqrt(2 * cfg.layers)  # GPT-2's scaled residual init
        self.qkv = ColumnParallelLinear(
            full_weight(f"{name}.qkv.weight", (3 * h, h), seed=seed, std=0.02), torch.zeros(3 * h),
            f"{name}.qkv", tp, weight_groups=3)
        self.proj = RowParallelLinear(
            full_weight(f"{name}.proj.weight", (h, h), seed=seed, std=proj_std), torch.zeros(h),
            f"{name}.proj", tp)
        self.local_heads = cfg.heads // tp.group.size
        self.head_dim = h // cfg.heads
        self.cp = cp

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (s[/t], b, h)
        qkv = self.qkv(x)  # (s, b, 3h/t)
        s, b, _ = qkv.shape
        q, k, v = qkv.view(s, b, 3, self.local_heads, self.head_dim).permute(2, 1, 3, 0, 4)
        if self.cp is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (b, nh/t, s, hs)
        else:  # s is s/c here
            y = ring_attention(q, k, v, self.cp)  # (b, nh/t, s/c, hs)
        y = y.permute(2, 0, 1, 3).reshape(s, b, self.local_heads * self.head_dim)  # (s, b, h/t)
        return self.proj(y)  # (s[/t], b, h)


class MLP(nn.Module):
    """h -> 4h (column-parallel) -> GELU -> h (row-parallel)."""

    def __init__(self, cfg: GPTConfig, name: str, tp: TensorParallel, seed: int):
        super().__init__()
        h = cfg.hidden
        proj_std = 0.02 / math.sqrt(2 * cfg.layers)
        self.fc1 = ColumnParallelLinear(
            full_weight(f"{name}.fc1.weight", (4 * h, h), seed=seed, std=0.02), torch.zeros(4 * h),
            f"{name}.fc1", tp)
        self.fc2 = RowParallelLinear(
            full_weight(f"{name}.fc2.weight", (h, 4 * h), seed=seed, std=proj_std), torch.zeros(h),
            f"{name}.fc2", tp)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (s[/t], b, h)
        return self.fc2(F.gelu(self.fc1(x)))  # (s, b, 4h/t) inside


def moe_mlp(cfg: GPTConfig, name: str, ep: ExpertParallel, seed: int) -> MixtureOfExperts:
    """The MLP of a block as ``cfg.moe_experts`` experts of the MLP's shape and init."""
    h, experts = cfg.hidden, cfg.moe_experts
    proj_std = 0.02 / math.sqrt(2 * cfg.layers)
    return MixtureOfExperts(
        name=name, ep=ep,
        router=full_weight(f"{name}.router.weight", (experts, h), seed=seed, std=0.02),
        fc1=(full_weight(f"{name}.experts.fc1.weight", (experts, 4 * h, h), seed=seed, std=0.02),
             torch.zeros(experts, 4 * h)),
        fc2=(full_weight(f"{name}.experts.fc2.weight", (experts, h, 4 * h), seed=seed,
                         std=proj_std), torch.zeros(experts, h)))


class Block(nn.Module):
    """Pre-LN transformer block: x + attn(ln1(x)), then x + mlp(ln2(x))."""

    def __init__(self, cfg: GPTConfig, index: int, tp: TensorParallel, seed: int,
                 cp: Optional[ContextParallel] = None, ep: Optional[ExpertParallel] = None):
        super().__init__()
        name = f"blocks.{index}"
        self.ln1 = LayerNorm(f"{name}.ln1", cfg.hidden, tp)
        self.attn = CausalSelfAttention(cfg, f"{name}.attn", tp, seed, cp)
        self.ln2 = LayerNorm(f"{name}.ln2", cfg.hidden, tp)
        if cfg.moe_experts:
            self.mlp = moe_mlp(cfg, f"{name}.mlp", ep, seed)
        else:
            self.mlp = MLP(cfg, f"{name}.mlp", tp, seed)
        self.dropout = cfg.dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (s[/t], b, h)
        x = x + _dropout(self.attn(self.ln1(x)), self.dropout, self.training)
        return x + _dropout(self.mlp(self.ln2(x)), self.dropout, self.training)


class Embedding(nn.Module):
    """Vocab-parallel word embedding plus learned positions. Under SP the result is split
    onto sequence shards (as Megatron does with absolute position embeddings). With context
    parallelism the token ids are this CP rank's and take the positions of its chunks."""

    def __init__(self, cfg: GPTConfig, tp: TensorParallel, seed: int,
                 cp: Optional[ContextParallel] = None):
        super().__init__()
        self.tp = tp
        self.cp_positions = None if cp is None else cp.positions()  # (s/c,)
        self.wte = VocabParallelEmbedding(
            full_weight("wte.weight", (cfg.vocab, cfg.hidden), seed=seed, std=0.02), "wte", tp)
        self.wpe = sharded_parameter(
            full_weight("wpe.weight", (cfg.seq_len, cfg.hidden), seed=seed, std=0.02),
            ShardInfo("wpe.weight", (cfg.seq_len, cfg.hidden)), tp.group)
        self.dropout = cfg.dropout

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # (b, s)
        if self.cp_positions is None:
            x = self.wte(ids) + self.wpe[: ids.shape[1]]  # (b, s, h)
        else:
            x = self.wte(ids) + self.wpe[self.cp_positions.to(ids.device)]  # (b, s/c, h)
        x = x.transpose(0, 1).contiguous()  # (s, b, h)
        if self.tp.sequence_parallel:
            x = scatter_to_sequence_parallel_region(x, self.tp.group)  # (s/t, b, h)
        return _dropout(x, self.dropout, self.training)


class LMHead(nn.Module):
    """Final LayerNorm, logits against the (tied) word embedding, vocab-parallel loss.

    With one pipeline stage the head uses the embedding's own parameter; otherwise the last
    stage keeps a copy whose gradient is all-reduced with the first stage's every iteration.
    """

    def __init__(self, cfg: GPTConfig, tp: TensorParallel, seed: int,
                 tied_weight: Optional[nn.Parameter]):
        super().__init__()
        # NOTE: the head's weight gradient is never deferred to W: with one stage the tied
        # weight also gets the embedding's gradient in B, and one parameter's gradient split
        # over B and W would reach the data-parallel reducer twice per micro-batch.
        self.tp = dataclasses.replace(tp, weight_grad_store=None)
        self.ln_f = LayerNorm("ln_f", cfg.hidden, tp)
        if tied_weight is None:
            tied_weight = sharded_parameter(
                full_weight("wte.weight", (cfg.vocab, cfg.hidden), seed=seed, std=0.02),
                ShardInfo("wte.weight", (cfg.vocab, cfg.hidden), 0), tp.group)
            self.weight = tied_weight
        self._tied = [tied_weight]  # a list, so a shared parameter is not registered twice

    def forward(self, x: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = column_parallel_linear(self.ln_f(x), self._tied[0], None, self.tp)  # (s, b, V/t)
        return vocab_parallel_cross_entropy(logits, targets, self.tp.group).mean()


class GPTChunk(nn.Module):
    """Blocks ``layers`` of the GPT; the first chunk embeds token ids (b, s), the last returns
    the mean loss against targets (s, b); others map (s[/t], b, h) to the same shape."""

    def __init__(self, cfg: GPTConfig, *, layers: range, first: bool, last: bool,
                 tp: TensorParallel, seed: int, cp: Optional[ContextParallel] = None,
                 ep: Optional[ExpertParallel] = None):
        super().__init__()
        self.embedding = Embedding(cfg, tp, seed, cp) if first else None
        # NOTE: keyed by the global layer index, so module paths (GPTChunk.blocks.5.attn) name
        # the same layer on every stage and chunk, in traces and diffs
        self.blocks = nn.ModuleDict({str(i): Block(cfg, i, tp, seed, cp, ep) for i in layers})
        tied = self.embedding.wte.weight if first else None
        self.head = LMHead(cfg, tp, seed, tied) if last else None

    def forward(self, x: torch.Tensor, targets: Optional[torch.Tensor] = None) -> torch.Tensor:
        if self.embedding is not None:
            x = self.embedding(x)
        for block in self.blocks.values():
            x = block(x)
        return self.head(x, targets) if self.head is not None else x

    def tied_embedding_copy(self) -> Optional[nn.Parameter]:
        """This chunk's copy of the word embedding when the head lives on another stage."""
        if self.embedding is not None and self.head is None:
            return self.embedding.wte.weight
        if self.head is not None and self.embedding is None:
            return self.head.weight
        return None
