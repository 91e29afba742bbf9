"""Process groups of a tp x dp x pp run, all cut from one rank grid.

Megatron's rank order makes TP the fastest-varying index: global = tp + t*(dp + d*pp), so the
grid is ``arange(world).view(pp, dp, tp)`` and a TP group is a row of it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Group:
    """One process group as seen from a member: its handle (None when it has one member,
    so that communication helpers can skip it), the member's index and the global ranks."""

    handle: Optional[dist.ProcessGroup]
    rank: int
    ranks: tuple[int, ...]

    @property
    def size(self) -> int:
        return len(self.ranks)


@dataclass(frozen=True)
class ParallelGroups:
    """Every group this rank belongs to.

    ``pp`` carries activations and ``pp_grad`` gradients between pipeline stages; two groups
    over the same ranks so that each directed channel carries one kind of message in one order
    (NCCL ignores P2P tags; see pp_communications).
    ``embedding`` joins the first and last stage, which both hold the tied word embedding.
    """

    tp: Group
    dp: Group
    pp: Group
    pp_grad: Group
    embedding: Optional[Group]
    world_rank: int
    world_size: int


def rank_grid(*, tp: int, dp: int, pp: int) -> torch.Tensor:
    """Global rank of (pp, dp, tp) coordinates: grid[p, d, t] = t + tp*(d + dp*p)."""
    return torch.arange(tp * dp * pp).view(pp, dp, tp)


def _make(ranks_lists: list[list[int]], me: int) -> Optional[Group]:
    """Create a group for every rank list (every rank must call new_group for every group, in
    the same order) and return the one containing ``me``."""
    mine = None
    for ranks in ranks_lists:
        handle = dist.new_group(ranks) if len(ranks) > 1 else None
        if me in ranks:
            mine = Group(handle=handle, rank=ranks.index(me), ranks=tuple(ranks))
    return mine


def build_groups(*, tp: int, dp: int, pp: int) -> ParallelGroups:
    """Build all groups; call once on every rank after init_process_group."""
    me, world = dist.get_rank(), dist.get_world_size()
    grid = rank_grid(tp=tp, dp=dp, pp=pp)
    tp_lists = [grid[p, d, :].tolist() for p in range(pp) for d in range(dp)]
    dp_lists = [grid[p, :, t].tolist() for p in range(pp) for t in range(tp)]
    pp_lists = [grid[:, d, t].tolist() for d in range(dp) for t in range(tp)]
    groups = dict(tp=_make(tp_lists, me), dp=_make(dp_lists, me), pp=_make(pp_lists, me),
                  pp_grad=_make(pp_lists, me))
    embedding = None
    if pp > 1:
        embedding = _make([[ranks[0], ranks[-1]] for ranks in pp_lists], me)
    return ParallelGroups(**groups, embedding=embedding, world_rank=me, world_size=world)


def single_process_groups() -> ParallelGroups:
    """Groups of a run without torch.distributed: everything has one member."""
    solo = Group(handle=None, rank=0, ranks=(0,))
    return ParallelGroups(tp=solo, dp=solo, pp=solo, pp_grad=solo, embedding=None,
                          world_rank=0, world_size=1)
