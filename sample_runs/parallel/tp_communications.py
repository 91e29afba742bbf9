"""Communication operators of tensor and sequence parallelism, as autograd Functions.

Tensor parallelism (Shoeybi et al. 2019) needs two conjugate operators:
  f = copy_to_tensor_parallel_region:  identity forward, all-reduce backward
  g = reduce_from_tensor_parallel_region: all-reduce forward, identity backward
Sequence parallelism (Korthikanti et al. 2022) replaces them around the sequence-sharded
LayerNorm/dropout regions, with the sequence dimension first ([s, b, h], Megatron's layout):
  gather_from_sequence_parallel_region:     all-gather forward, reduce-scatter backward
      (fused into the column-parallel linear, tensor_parallel._LinearWithDeferrableWeightGrad,
      which saves only the shard and re-gathers it for the weight gradient, as Megatron does)
  reduce_scatter_to_sequence_parallel_region: reduce-scatter forward, all-gather backward
  scatter_to_sequence_parallel_region:      split forward (no comm), all-gather backward
Every helper is a no-op on a group of one, so a single-process run issues no collectives.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist

from sample_runs.parallel.process_groups import Group

# Single-tensor all-gather and reduce-scatter: torch 2.13 named them *_single and deprecated
# the older names, the only ones before it; both issue the same c10d ops (the one place the
# reference GPT bridges torch versions)
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def all_reduce(x: torch.Tensor, group: Group, op=dist.ReduceOp.SUM) -> torch.Tensor:
    """In-place all-reduce over ``group`` (returns ``x``)."""
    if group.size > 1:
        dist.all_reduce(x, op=op, group=group.handle)
    return x


def start_all_gather_first_dim(x: torch.Tensor, group: Group
                               ) -> tuple[torch.Tensor, Optional[dist.Work]]:
    """Launch the concatenation of all ranks' shards along dim 0, (s/t, ...) -> (s, ...);
    read the result only after waiting on the returned work (None: nothing to wait for)."""
    if group.size == 1:
        return x, None
    out = torch.empty((x.shape[0] * group.size, *x.shape[1:]), dtype=x.dtype, device=x.device)
    return out, all_gather_single(out, x.contiguous(), group=group.handle, async_op=True)


def start_reduce_scatter_first_dim(x: torch.Tensor, group: Group
                                   ) -> tuple[torch.Tensor, Optional[dist.Work]]:
    """Launch the sum over ranks keeping this rank's slice of dim 0, (s, ...) -> (s/t, ...)."""
    if group.size == 1:
        return x, None
    out = torch.empty((x.shape[0] // group.size, *x.shape[1:]), dtype=x.dtype, device=x.device)
    return out, reduce_scatter_single(out, x.contiguous(), group=group.handle, async_op=True)


def all_gather_first_dim(x: torch.Tensor, group: Group) -> torch.Tensor:
    """Concatenate the shards of all ranks along dim 0: (s/t, ...) -> (s, ...)."""
    if group.size == 1:
        return x
    out = torch.empty((x.shape[0] * group.size, *x.shape[1:]), dtype=x.dtype, device=x.device)
    all_gather_single(out, x.contiguous(), group=group.handle)
    return out


def reduce_scatter_first_dim(x: torch.Tensor, group: Group) -> torch.Tensor:
    """Sum over ranks and keep this rank's slice of dim 0: (s, ...) -> (s/t, ...)."""
    if group.size == 1:
        return x
    out = torch.empty((x.shape[0] // group.size, *x.shape[1:]), dtype=x.dtype, device=x.device)
    reduce_scatter_single(out, x.contiguous(), group=group.handle)
    return out


def wait(work: Optional[dist.Work]) -> None:
    if work is not None:
        work.wait()


def split_first_dim(x: torch.Tensor, group: Group) -> torch.Tensor:
    """This rank's slice of dim 0, no communication: (s, ...) -> (s/t, ...)."""
    if group.size == 1:
        return x
    return x.chunk(group.size, dim=0)[group.rank].contiguous()


class _CopyToTensorParallelRegion(torch.autograd.Function):
    """The f operator: identity forward, all-reduce backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        return all_reduce(grad.contiguous(), ctx.group), None


class _ReduceFromTensorParallelRegion(torch.autograd.Function):
    """The g operator: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        return all_reduce(x.contiguous(), group)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class _ReduceScatterToSequenceParallelRegion(torch.autograd.Function):
    """Reduce-scatter forward, all-gather backward: g for a sequence-parallel region."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return reduce_scatter_first_dim(x, group)

    @staticmethod
    def backward(ctx, grad):
        return all_gather_first_dim(grad, ctx.group), None


class _ScatterToSequenceParallelRegion(torch.autograd.Function):
    """Split forward (no comm), all-gather backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return split_first_dim(x, group)

    @staticmethod
    def backward(ctx, grad):
        return all_gather_first_dim(grad, ctx.group), None


def copy_to_tensor_parallel_region(x: torch.Tensor, group: Group) -> torch.Tensor:
    return x if group.size == 1 else _CopyToTensorParallelRegion.apply(x, group)


def reduce_from_tensor_parallel_region(x: torch.Tensor, group: Group) -> torch.Tensor:
    return x if group.size == 1 else _ReduceFromTensorParallelRegion.apply(x, group)


def reduce_scatter_to_sequence_parallel_region(x: torch.Tensor, group: Group) -> torch.Tensor:
    return x if group.size == 1 else _ReduceScatterToSequenceParallelRegion.apply(x, group)


def scatter_to_sequence_parallel_region(x: torch.Tensor, group: Group) -> torch.Tensor:
    return x if group.size == 1 else _ScatterToSequenceParallelRegion.apply(x, group)
