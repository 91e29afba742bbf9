"""Rank roles: which rank of one run plays the part of which rank of another.

Two runs with different layouts (TP 2 against TP 4, 2 stages against 4) have different world
sizes, so rank numbers say nothing across them. A rank's *role* does: its pipeline stage, its TP
rank and its DP rank. With the run configuration the reference GPT records (``tp``, ``pp``,
``cp``, ``dp``; without ``dp``, the rest of the world) and Megatron's rank grid, every rank
has one. Stages are named by
position (first, middle k, last), so the first and last stages of a 2-stage run match those of
a 4-stage run; a single stage (pp 1) is matched with the first stage.

Runs without such a configuration (any other script), or whose two configurations are not both
known, fall back to same-index ranks. Process groups are named the same way: by the grid axes
their members span (a TP group, a DP group, a pipeline group), else by their size.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..analysis.timeline.grid import AXES, Grid, grid_of


@dataclass(frozen=True)
class Role:
    """What a rank does in its run. ``key`` is what is matched across runs."""

    key: tuple
    label: str


def _stage_name(stage: int, stages: int) -> str:
    if stage == 0:
        return "first"
    if stage == stages - 1:
        return "last"
    return f"middle {stage}"


def grid_role(rank: int, grid: Grid) -> Role:
    """The role of global ``rank`` in a Megatron grid (viz.analysis.timeline.grid)."""
    tp_rank, cp_rank, dp_rank, stage = grid.coords(rank)
    name = _stage_name(stage, grid.pp)
    where = f"tp {tp_rank} · " + (f"cp {cp_rank} · " if grid.cp > 1 else "") + f"dp {dp_rank}"
    label = f"stage {name} ({stage} of {grid.pp}) · {where}" if grid.pp > 1 else where
    return Role(("stage", name, tp_rank, cp_rank, dp_rank), label)


def group_label(members, grid: Optional[Grid]) -> str:
    """What a process group spans, comparable across layouts: ``tp group of 2``, ``pp group of
    4``, ``tp+dp group of 8`` (the grid axes along which its members differ; the first and last
    stages' tied-embedding group is a ``pp`` group), or ``group of N`` without a grid."""
    members = list(members)
    if not members:
        return "unresolved group"
    size = f"group of {len(members)}"
    if grid is None:
        return size
    coords = [grid.coords(r) for r in members]
    axes = [name for i, name in enumerate(AXES) if len({c[i] for c in coords}) > 1]
    return f"{'+'.join(axes)} {size}" if axes else size


def assign_roles(config_a: dict, world_a: int, ranks_a, config_b: dict, world_b: int,
                 ranks_b) -> tuple:
    """(rank -> Role for run A, rank -> Role for run B, how roles were assigned)."""
    grid_a, grid_b = grid_of(config_a, world_a), grid_of(config_b, world_b)
    if grid_a and grid_b:
        return ({r: grid_role(r, grid_a) for r in ranks_a},
                {r: grid_role(r, grid_b) for r in ranks_b},
                "grid: pipeline stage (first / middle k / last), TP, CP and DP rank from the "
                "recorded configuration (Megatron order: global = tp + t*(cp + c*(dp + d*pp)))")
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
