"""All-to-all of expert parallelism (GShard, Lepikhin et al. 2020): dispatch sends every EP rank
the tokens routed to its experts, combine sends the experts' outputs back.

The buffers are split evenly (each source keeps ``capacity`` slots per expert, padded), so the
all-to-all is its own inverse up to the direction of travel: the backward of a dispatch is the
same all-to-all of the gradient, block j going back to rank j. Two all-to-alls forward and two
backward per MoE layer per micro-batch.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from sample_runs.parallel.process_groups import Group


def all_to_all_first_dim(x: torch.Tensor, group: Group) -> torch.Tensor:
    """Block j of dim 0 goes to rank j; block j of the result came from rank j. (e, ...)"""
    if group.size == 1:
        return x
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x.contiguous(), group=group.handle)
    return out


class _AllToAll(torch.autograd.Function):
    """All-to-all forward, the same all-to-all of the gradient backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return all_to_all_first_dim(x, group)

    @staticmethod
    def backward(ctx, grad):
        return all_to_all_first_dim(grad, ctx.group), None


def all_to_all(x: torch.Tensor, group: Group) -> torch.Tensor:
    """Differentiable all-to-all over ``group`` along dim 0 (a no-op on a group of one)."""
    return x if group.size == 1 else _AllToAll.apply(x, group)
