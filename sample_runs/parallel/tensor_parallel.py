"""Megatron tensor parallelism (Shoeybi et al. 2019) with sequence parallelism (Korthikanti
et al. 2022): column- and row-parallel linears, a vocab-parallel embedding and a vocab-parallel
cross entropy. Every parameter is a slice of the full single-process parameter (ShardInfo), so
all layouts start from the same weights. Activations are [s, b, h] (sequence first).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from sample_runs.parallel.process_groups import Group
from sample_runs.parallel.tp_communications import (
    all_gather_first_dim, all_reduce, copy_to_tensor_parallel_region,
    reduce_from_tensor_parallel_region, reduce_scatter_to_sequence_parallel_region,
    start_all_gather_first_dim, start_reduce_scatter_first_dim, wait)
from sample_runs.parallel.weight_grad_store import WeightGradStore, accumulate_grad


@dataclass(frozen=True)
class TensorParallel:
    """How layers of this rank are split: the TP group, whether activations outside the
    TP regions are sequence-sharded, and where to defer weight gradients (zero bubble)."""

    group: Group
    sequence_parallel: bool = False
    weight_grad_store: Optional[WeightGradStore] = None


@dataclass(frozen=True)
class ShardInfo:
    """Where a local parameter sits in the full single-process model.

    ``dim`` is the dimension split over TP ranks (None: replicated). A dimension that stacks
    ``groups`` blocks (the fused [q; k; v] weight) is split block by block, so each rank gets
    whole heads of q, k and v. ``sequence_parallel`` marks a replicated parameter applied to a
    sequence shard, whose gradient must be summed over the TP group. ``expert_parallel`` marks
    expert weights, split along ``dim`` over the EP group instead of TP (expert_parallel.py).
    """

    name: str
    full_shape: tuple[int, ...]
    dim: Optional[int] = None
    groups: int = 1
    sequence_parallel: bool = False
    expert_parallel: bool = False

    def shard(self, full: torch.Tensor, rank: int, size: int) -> torch.Tensor:
        if self.dim is None or size == 1:
            return full.clone()
        d = self.dim
        blocks = full.unflatten(d, (self.groups, -1))  # (..., groups, n/groups, ...)
        return blocks.chunk(size, dim=d + 1)[rank].flatten(d, d + 1).clone()

    def unshard(self, shards: list[torch.Tensor]) -> torch.Tensor:
        """Inverse of ``shard``: the full tensor from the shards of ranks 0..t-1."""
        if self.dim is None or len(shards) == 1:
            return shards[0]
        d = self.dim
        blocks = [s.unflatten(d, (self.groups, -1)) for s in shards]
        return torch.cat(blocks, dim=d + 1).flatten(d, d + 1)


def sharded_parameter(full: torch.Tensor, info: ShardInfo, group: Group) -> nn.Parameter:
    """This rank's slice of ``full`` as a Parameter tagged with ``shard_info``."""
    param = nn.Parameter(info.shard(full, group.rank, group.size))
    param.shard_info = info
    return param


class _LinearWithDeferrableWeightGrad(torch.autograd.Function):
    """y = x W^T + b; with ``gather_input`` x is sequence-sharded and all-gathered first.

    Backward follows Megatron's LinearWithGradAccumulationAndAsyncCommunication: only the
    sharded input is saved, and it is all-gathered again for the weight gradient (a memory
    saving that costs one more all-gather); the input gradient is reduce-scattered back to the
    sequence shard. With a WeightGradStore the weight gradient (and its re-gather) becomes a
    closure run later in the W pass; the parameters then enter detached, so autograd never
    accumulates into them and W does it instead.
    """

    @staticmethod
    def forward(ctx, x, weight, bias, group, gather_input, store, params):
        total = all_gather_first_dim(x, group) if gather_input else x  # (s, b, in)
        ctx.save_for_backward(x, weight)
        ctx.group, ctx.gather_input, ctx.store, ctx.params = group, gather_input, store, params
        ctx.has_bias = bias is not None
        return F.linear(total, weight, bias)  # (s, b, out)

    @staticmethod
    def backward(ctx, grad_out):
        x, weight = ctx.saved_tensors
        group, gather = ctx.group, ctx.gather_input
        # NOTE: as in Megatron, the re-gather runs while the input gradient is computed, and
        # the reduce-scatter of the input gradient while the weight gradient is computed.
        total, gathering = x, None
        if gather and ctx.store is None:
            total, gathering = start_all_gather_first_dim(x, group)  # (s, b, in)
        grad_total = grad_out.matmul(weight)  # (s, b, in)
        wait(gathering)
        grad_x, scattering = grad_total, None
        if gather:
            grad_x, scattering = start_reduce_scatter_first_dim(grad_total, group)  # (s/t, b, in)
        if ctx.store is None:
            grad_w, grad_b = _weight_grads(grad_out, total, ctx.has_bias)
            wait(scattering)
            return grad_x, grad_w, grad_b, None, None, None, None
        wait(scattering)
        store, params, has_bias = ctx.store, ctx.params, ctx.has_bias

        @torch.no_grad()  # W runs outside autograd's backward, where grad mode is on
        def weight_grad_pass() -> None:
            regathered = all_gather_first_dim(x, group) if gather else x
            grad_w, grad_b = _weight_grads(grad_out, regathered, has_bias)
            accumulate_grad(params[0], grad_w, store)
            if has_bias:
                accumulate_grad(params[1], grad_b, store)

        store.put(weight_grad_pass)
        return grad_x, None, None, None, None, None, None


def _weight_grads(grad_out, total_input, has_bias):
    grad_2d = grad_out.flatten(0, -2)  # (s*b, out)
    grad_w = grad_2d.t().matmul(total_input.flatten(0, -2))  # (out, in)
    return grad_w, (grad_2d.sum(0) if has_bias else None)


def parallel_linear(x: torch.Tensor, weight: nn.Parameter, bias: Optional[nn.Parameter],
                    tp: TensorParallel, *, gather_input: bool) -> torch.Tensor:
    store = tp.weight_grad_store
    params = (weight, bias)
    if store is not None:
        weight = weight.detach()
        bias = None if bias is None else bias.detach()
    return _LinearWithDeferrableWeightGrad.apply(x, weight, bias, tp.group, gather_input, store,
                                                 params)


def column_parallel_linear(x: torch.Tensor, weight: nn.Parameter, bias: Optional[nn.Parameter],
                           tp: TensorParallel) -> torch.Tensor:
    """Y_r = X A_r for this rank's output columns A_r. Without SP the input passes through f
    (all-reduce of its gradient); with SP it is all-gathered from the sequence shards."""
    if not tp.sequence_parallel:
        x = copy_to_tensor_parallel_region(x, tp.group)  # f
    return parallel_linear(x, weight, bias, tp, gather_input=tp.sequence_parallel)


class ColumnParallelLinear(nn.Module):
    """Linear layer whose output features are split over TP ranks; output stays split."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor, name: str, tp: TensorParallel,
                 *, weight_groups: int = 1):
        super().__init__()
        self.tp = tp
        self.weight = sharded_parameter(
            weight, ShardInfo(f"{name}.weight", tuple(weight.shape), 0, weight_groups), tp.group)
        self.bias = sharded_parameter(
            bias, ShardInfo(f"{name}.bias", tuple(bias.shape), 0, weight_groups), tp.group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (s[/t], b, in) -> (s, b, out/t)
        return column_parallel_linear(x, self.weight, self.bias, self.tp)


class RowParallelLinear(nn.Module):
    """Linear layer whose input features are split over TP ranks: partial sums are combined by
    g (all-reduce), or with SP by a reduce-scatter onto sequence shards. The bias is added after
    the reduction, so under SP it sees a sequence shard (sequence_parallel parameter)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor, name: str, tp: TensorParallel):
        super().__init__()
        self.tp = tp
        self.weight = sharded_parameter(
            weight, ShardInfo(f"{name}.weight", tuple(weight.shape), 1), tp.group)
        self.bias = sharded_parameter(
            bias, ShardInfo(f"{name}.bias", tuple(bias.shape), None,
                            sequence_parallel=tp.sequence_parallel), tp.group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (s, b, in/t) -> (s[/t], b, out)
        partial = parallel_linear(x, self.weight, None, self.tp, gather_input=False)
        if self.tp.sequence_parallel:
            out = reduce_scatter_to_sequence_parallel_region(partial, self.tp.group)
        else:
            out = reduce_from_tensor_parallel_region(partial, self.tp.group)  # g
        return out + self.bias


class VocabParallelEmbedding(nn.Module):
    """Embedding table split by vocabulary rows: each rank looks up the ids in its range,
    zeros the others, and g (all-reduce) sums the partial embeddings."""

    def __init__(self, weight: torch.Tensor, name: str, tp: TensorParallel):
        super().__init__()
        self.tp = tp
        self.weight = sharded_parameter(
            weight, ShardInfo(f"{name}.weight", tuple(weight.shape), 0), tp.group)
        self.vocab_start = tp.group.rank * self.weight.shape[0]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # (b, s) -> (b, s, h)
        if self.tp.group.size == 1:
            return F.embedding(ids, self.weight)
        local = ids - self.vocab_start
        outside = (local < 0) | (local >= self.weight.shape[0])
        emb = F.embedding(local.masked_fill(outside, 0), self.weight)  # (b, s, h)
        emb = emb.masked_fill(outside.unsqueeze(-1), 0.0)
        return reduce_from_tensor_parallel_region(emb, self.tp.group)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Cross entropy over logits split by vocabulary, without gathering them: three
    all-reduces of s*b values (max logit MAX, predicted logit SUM, sum of exp SUM)."""

    @staticmethod
    def forward(ctx, logits, target, group, vocab_start):  # (s, b, V/t), (s, b)
        logits_max = all_reduce(logits.max(dim=-1).values, group, dist.ReduceOp.MAX)  # (s, b)
        shifted = logits - logits_max.unsqueeze(-1)
        local = target - vocab_start
        outside = (local < 0) | (local >= logits.shape[-1])
        local = local.masked_fill(outside, 0)
        predicted = shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        predicted = all_reduce(predicted, group)  # (s, b)
        exp = shifted.exp()
        sum_exp = all_reduce(exp.sum(dim=-1), group)  # (s, b)
        ctx.save_for_backward(exp.div_(sum_exp.unsqueeze(-1)), local, outside)
        return sum_exp.log() - predicted  # (s, b)

    @staticmethod
    def backward(ctx, grad_loss):
        softmax, local, outside = ctx.saved_tensors
        grad = softmax.clone()
        grad.scatter_add_(-1, local.unsqueeze(-1), (outside.to(grad.dtype) - 1.0).unsqueeze(-1))
        return grad.mul_(grad_loss.unsqueeze(-1)), None, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, target: torch.Tensor,
                                 group: Group) -> torch.Tensor:
    """Per-token loss (s, b) of logits (s, b, V/t) split over ``group`` by vocabulary."""
    return _VocabParallelCrossEntropy.apply(logits, target, group, group.rank * logits.shape[-1])


def all_reduce_sequence_parallel_grads(params: list[nn.Parameter], group: Group) -> None:
    """Sum over the TP group the gradients of replicated parameters that saw only a sequence
    shard (LayerNorm weights and biases, row-parallel biases): one all-reduce per iteration."""
    grads = [p.grad for p in params
             if p.grad is not None and getattr(p, "shard_info", None) is not None
             and p.shard_info.sequence_parallel]
    if group.size == 1 or not grads:
        return
    flat = all_reduce(torch.cat([g.reshape(-1) for g in grads]), group)
    for grad, chunk in zip(grads, flat.split([g.numel() for g in grads])):
        grad.copy_(chunk.view_as(grad))
