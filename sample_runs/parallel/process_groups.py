"""Process groups of a tp x cp x dp x pp run (expert parallelism carved out of DP), all cut
from one rank grid.

Megatron's rank order makes TP the fastest-varying index, then CP, then DP, then PP:
``global = tp + t*(cp + c*(dp + d*pp))``. The grid is ``arange(world).view(pp, d*c, tp)``: a
TP group is a row of it, and its middle axis ``j = cp + c*dp`` runs over the data-and-context
ranks of one (stage, TP rank), the group over which gradients are reduced (Megatron's DP x CP
group). Without CP (c = 1) the middle axis is plain DP.

Expert parallelism (MoE) is carved out of DP as in Megatron: ``dp = ep_rank + e*expert_dp_rank``,
so an EP group is e consecutive DP ranks (its members route tokens to each other's experts) and
the expert-data-parallel group joins the DP ranks holding the same experts. EP needs c = 1 here.
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

    ``dp_cp`` reduces gradients and averages the loss (DP x CP; the same group as ``dp``
    without CP); ``cp`` passes keys and values around the attention ring; ``ep`` exchanges
    tokens between experts and ``expert_dp`` reduces expert gradients (``dp`` without EP).
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
    cp: Group
    dp_cp: Group
    ep: Group
    expert_dp: Group


def rank_grid(*, tp: int, dp: int, pp: int) -> torch.Tensor:
    """Global rank of (pp, dp, tp) coordinates: grid[p, d, t] = t + tp*(d + dp*p). With CP,
    pass dp = d*c: the middle index is then cp + c*dp."""
    return torch.arange(tp * dp * pp).view(pp, dp, tp)


def _make(ranks_lists: list[list[int]], me: int, desc: str) -> Optional[Group]:
    """Create a group for every rank list (every rank must call new_group for every group, in
    the same order) and return the one containing ``me``. ``desc`` names the groups
    (``group_desc``): the trace says which parallel dimension each one is."""
    mine = None
    for ranks in ranks_lists:
        handle = dist.new_group(ranks, group_desc=desc) if len(ranks) > 1 else None
        if me in ranks:
            mine = Group(handle=handle, rank=ranks.index(me), ranks=tuple(ranks))
    return mine


def _solo(me: int) -> Group:
    return Group(handle=None, rank=0, ranks=(me,))


def build_groups(*, tp: int, dp: int, pp: int, cp: int = 1, ep: int = 1) -> ParallelGroups:
    """Build all groups; call once on every rank after init_process_group."""
    me, world = dist.get_rank(), dist.get_world_size()
    data = dp * cp  # the middle axis: cp + c*dp
    grid = rank_grid(tp=tp, dp=data, pp=pp)
    tp_lists = [grid[p, d, :].tolist() for p in range(pp) for d in range(data)]
    dp_lists = [grid[p, :, t].tolist() for p in range(pp) for t in range(tp)]
    pp_lists = [grid[:, d, t].tolist() for d in range(data) for t in range(tp)]
    groups = dict(tp=_make(tp_lists, me, "tp"),
                  dp_cp=_make(dp_lists, me, "dp_cp" if cp > 1 else "dp"),
                  pp=_make(pp_lists, me, "pp"), pp_grad=_make(pp_lists, me, "pp_grad"))
    embedding = None
    if pp > 1:
        embedding = _make([[ranks[0], ranks[-1]] for ranks in pp_lists], me, "pp_embedding")
    groups.update(dp=groups["dp_cp"], cp=_solo(me))
    if cp > 1:
        cp_lists = [grid[p, d * cp:(d + 1) * cp, t].tolist()
                    for p in range(pp) for d in range(dp) for t in range(tp)]
        pure_dp_lists = [grid[p, c::cp, t].tolist()
                         for p in range(pp) for c in range(cp) for t in range(tp)]
        groups.update(cp=_make(cp_lists, me, "cp"), dp=_make(pure_dp_lists, me, "dp"))
    groups.update(ep=_solo(me), expert_dp=groups["dp"])
    if ep > 1:
        assert cp == 1, "expert parallelism is carved out of DP only when cp == 1"
        ep_lists = [grid[p, e * ep:(e + 1) * ep, t].tolist()
                    for p in range(pp) for e in range(dp // ep) for t in range(tp)]
        expert_dp_lists = [grid[p, i::ep, t].tolist()
                           for p in range(pp) for i in range(ep) for t in range(tp)]
        groups.update(ep=_make(ep_lists, me, "ep"),
                      expert_dp=_make(expert_dp_lists, me, "dp_expert"))
    return ParallelGroups(**groups, embedding=embedding, world_rank=me, world_size=world)


def single_process_groups() -> ParallelGroups:
    """Groups of a run without torch.distributed: everything has one member."""
    solo = _solo(0)
    return ParallelGroups(tp=solo, dp=solo, pp=solo, pp_grad=solo, embedding=None,
                          world_rank=0, world_size=1, cp=solo, dp_cp=solo, ep=solo,
                          expert_dp=solo)
