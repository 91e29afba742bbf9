"""Rank roles: which rank of one run plays the part of which rank of another.

Two runs with different layouts (TP 2 against TP 4, 2 stages against 4) have different world
sizes, so rank numbers say nothing across them. A rank's *role* does: its pipeline stage, its TP
rank and its DP rank. With the run configuration the reference GPT records (``tp``, ``pp``,
``dp``; without ``dp``, the world size over tp*pp) and Megatron's rank grid
(``global = tp_rank + t*(dp_rank + d*pp_rank)``), every rank has one. Stages are named by
position (first, middle k, last), so the first and last stages of a 2-stage run match those of
a 4-stage run; a single stage (pp 1) is matched with the first stage.

Runs without such a configuration (any other script), or whose two configurations are not both
known, fall back to same-index ranks. Process groups are named the same way: by the grid axes
their members span (a TP group, a DP group, a pipeline group), else by their size.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Role:
    """What a rank does in its run. ``key`` is what is matched across runs."""

    key: tuple
    label: str


def grid_of(config: dict, world_size: int) -> Optional[tuple]:
    """(tp, dp, pp) sizes if the config describes this world, else None."""
    try:
        t, p = int(config.get("tp") or 0), int(config.get("pp") or 0)
        # A script that records only tp and pp leaves the rest of the world to DP.
        d = int(config.get("dp") or (world_size // (t * p) if t > 0 and p > 0 else 0))
    except (TypeError, ValueError):
        return None
    if t < 1 or p < 1 or d < 1 or t * d * p != world_size:
        return None
    return t, d, p


def _stage_name(stage: int, stages: int) -> str:
    if stage == 0:
        return "first"
    if stage == stages - 1:
        return "last"
    return f"middle {stage}"


def grid_role(rank: int, t: int, d: int, p: int) -> Role:
    """The role of global ``rank`` in a (tp t, dp d, pp p) Megatron grid."""
    tp_rank, dp_rank, stage = rank % t, (rank // t) % d, rank // (t * d)
    name = _stage_name(stage, p)
    label = f"stage {name} ({stage} of {p}) · tp {tp_rank} · dp {dp_rank}" if p > 1 else \
        f"tp {tp_rank} · dp {dp_rank}"
    return Role(("stage", name, tp_rank, dp_rank), label)


def group_label(members, grid: Optional[tuple]) -> str:
    """What a process group spans, comparable across layouts: ``tp group of 2``, ``pp group of
    4``, ``tp+dp group of 8`` (the grid axes along which its members differ; the first and last
    stages' tied-embedding group is a ``pp`` group), or ``group of N`` without a grid."""
    members = list(members)
    if not members:
        return "unresolved group"
    size = f"group of {len(members)}"
    if grid is None:
        return size
    t, d, _ = grid
    coords = [(r % t, (r // t) % d, r // (t * d)) for r in members]
    axes = [name for i, name in enumerate(("tp", "dp", "pp"))
            if len({c[i] for c in coords}) > 1]
    return f"{'+'.join(axes)} {size}" if axes else size


def assign_roles(config_a: dict, world_a: int, ranks_a, config_b: dict, world_b: int,
                 ranks_b) -> tuple:
    """(rank -> Role for run A, rank -> Role for run B, how roles were assigned)."""
    grid_a, grid_b = grid_of(config_a, world_a), grid_of(config_b, world_b)
    if grid_a and grid_b:
        return ({r: grid_role(r, *grid_a) for r in ranks_a},
                {r: grid_role(r, *grid_b) for r in ranks_b},
                "grid: pipeline stage (first / middle k / last), TP rank, DP rank from the "
                "recorded configuration (Megatron order: global = tp + t*(dp + d*pp))")
    same = {r: Role(("rank", r), f"rank {r}") for r in set(ranks_a) | set(ranks_b)}
    return ({r: same[r] for r in ranks_a}, {r: same[r] for r in ranks_b},
            "same-index ranks: the runs do not both record a tp/pp/dp configuration matching "
            "their world size")


def match_roles(roles_a: dict, roles_b: dict) -> tuple:
    """(matched [(Role, rank in A, rank in B)], only in A [(label, rank)], only in B [...])."""
    by_key_b = {role.key: rank for rank, role in roles_b.items()}
    keys_a = {role.key for role in roles_a.values()}
    matched = [(role, rank, by_key_b[role.key]) for rank, role in sorted(roles_a.items())
               if role.key in by_key_b]
    only_a = [(role.label, rank) for rank, role in sorted(roles_a.items())
              if role.key not in by_key_b]
    only_b = [(role.label, rank) for rank, role in sorted(roles_b.items())
              if role.key not in keys_a]
    return matched, only_a, only_b
