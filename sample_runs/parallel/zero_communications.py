"""Flat buffers of ZeRO and their collectives (Rajbhandari et al. 2020).

A bucket of parameters is laid out in one flat buffer of P elements, padded to a multiple of
the data-parallel size d; DP rank r owns the contiguous slice [r*P/d, (r+1)*P/d) of it
(Megatron's distributed optimizer shards each bucket this way). Gradients are reduce-scattered
into that slice, updated parameters all-gathered from the slices. Every helper skips the
communication on a group of one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.distributed as dist
from torch import nn

from sample_runs.parallel.process_groups import Group
from sample_runs.parallel.tp_communications import (all_gather_first_dim, all_gather_single,
                                                    all_reduce, reduce_scatter_single)


@dataclass(frozen=True)
class ShardPiece:
    """The part of one parameter that falls in this rank's shard: elements
    [param_lo, param_hi) of the flattened parameter are [shard_lo, shard_hi) of the shard."""

    param: nn.Parameter
    shard_lo: int
    shard_hi: int
    param_lo: int
    param_hi: int


class FlatLayout:
    """Where each parameter of a bucket sits in the flat buffer, and this rank's shard."""

    def __init__(self, params: list[nn.Parameter], group: Group):
        self.params, self.group = params, group
        self.numels = [p.numel() for p in params]
        self.offsets = [sum(self.numels[:i]) for i in range(len(params))]
        numel = sum(self.numels)
        self.shard_numel = -(-numel // group.size)  # ceil
        self.padded_numel = self.shard_numel * group.size
        self.lo = group.rank * self.shard_numel
        self.hi = self.lo + self.shard_numel

    def flatten(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        """One tensor per parameter -> the padded flat buffer (a new tensor)."""
        flat = torch.cat([t.reshape(-1) for t in tensors])
        pad = self.padded_numel - flat.numel()
        return torch.cat([flat, flat.new_zeros(pad)]) if pad else flat

    def unflatten(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Views of the flat buffer shaped as the parameters."""
        return [flat[o:o + n].view(p.shape)
                for p, o, n in zip(self.params, self.offsets, self.numels)]

    def pieces(self) -> list[ShardPiece]:
        """The parameters (parts of them) that fall in this rank's shard."""
        out = []
        for param, offset, numel in zip(self.params, self.offsets, self.numels):
            lo, hi = max(offset, self.lo), min(offset + numel, self.hi)
            if lo < hi:
                out.append(ShardPiece(param, lo - self.lo, hi - self.lo, lo - offset, hi - offset))
        return out


def start_reduce_scatter(flat: torch.Tensor, group: Group
                         ) -> tuple[torch.Tensor, Optional[dist.Work]]:
    """Launch the sum over ``group`` of the padded flat buffer, keeping this rank's shard
    (P -> P/d); read the result only after waiting on the returned work."""
    if group.size == 1:
        return flat, None
    shard = torch.empty(flat.numel() // group.size, dtype=flat.dtype, device=flat.device)
    return shard, reduce_scatter_single(shard, flat, group=group.handle, async_op=True)


def start_all_gather(shard: torch.Tensor, group: Group, out: Optional[torch.Tensor] = None
                     ) -> tuple[torch.Tensor, Optional[dist.Work]]:
    """Launch the concatenation of every rank's shard (P/d -> P), into ``out`` if given."""
    if out is None:
        out = torch.empty(shard.numel() * group.size, dtype=shard.dtype, device=shard.device)
    if group.size == 1:
        out.copy_(shard)
        return out, None
    return out, all_gather_single(out, shard.contiguous(), group=group.handle, async_op=True)


def all_reduce_shard_pieces(shards: list[tuple[FlatLayout, torch.Tensor]],
                            select: Callable[[nn.Parameter], bool], group: Group) -> None:
    """Sum over ``group`` the reduced gradient of the selected parameters, acting only on this
    rank's shards: one all-reduce. Sums over TP (sequence-parallel parameters) or over the
    first and last stage (tied embedding) commute with the DP reduction, so summing the shard
    equals summing the full gradient, provided every member of ``group`` has the same layout
    (the same model on every TP rank; the tied embedding alone in its bucket)."""
    grads = [grad[piece.shard_lo:piece.shard_hi] for layout, grad in shards
             for piece in layout.pieces() if select(piece.param)]
    if group.size == 1 or not grads:
        return
    summed = all_reduce(torch.cat(grads), group)
    for grad, part in zip(grads, summed.split([g.numel() for g in grads])):
        grad.copy_(part)


def gather_full_grads(shards: list[tuple[FlatLayout, torch.Tensor]]
                      ) -> dict[int, torch.Tensor]:
    """id(param) -> its full reduced gradient, all-gathered from the shards (for --dump-grads;
    every rank of the group must call it)."""
    out = {}
    for layout, grad in shards:
        full = all_gather_first_dim(grad.detach(), layout.group)
        for param, view in zip(layout.params, layout.unflatten(full)):
            out[id(param)] = view.clone()
    return out
