"""The rank grid of a Megatron-style run, from the configuration it recorded.

Megatron's order makes TP the fastest-varying index, then CP, DP and PP:
``global = tp + t*(cp + c*(dp + d*pp))`` (the reference GPT's ``sample_runs.parallel
.process_groups``). A run that records ``tp`` and ``pp`` (and ``cp``, ``dp`` when not 1)
through ``tracer.record_config`` has a grid; any other run has none, and what needs one falls
back (same-index ranks in trace-diff, pipeline neighbours from P2P in the timeline).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

AXES = ("tp", "cp", "dp", "pp")


@dataclass(frozen=True)
class Grid:
    tp: int = 1
    cp: int = 1
    dp: int = 1
    pp: int = 1

    @property
    def world(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    def coords(self, rank: int) -> tuple[int, int, int, int]:
        """(tp, cp, dp, pp) indices of a global rank."""
        tp, rest = rank % self.tp, rank // self.tp
        cp, rest = rest % self.cp, rest // self.cp
        return tp, cp, rest % self.dp, rest // self.dp

    def rank(self, tp: int, cp: int, dp: int, pp: int) -> int:
        return tp + self.tp * (cp + self.cp * (dp + self.dp * pp))

    def pipeline(self, rank: int) -> tuple[int, ...]:
        """The ranks of ``rank``'s pipeline: same tp, cp and dp, every stage."""
        tp, cp, dp, _ = self.coords(rank)
        return tuple(self.rank(tp, cp, dp, s) for s in range(self.pp))


def grid_of(config: dict[str, Any], world_size: int) -> Optional[Grid]:
    """The grid if the config describes this world, else None. Without ``dp`` the world size
    over the other axes is DP."""
    try:
        t, p = int(config.get("tp") or 0), int(config.get("pp") or 0)
        c = int(config.get("cp") or 1)
        rest = t * p * c
        d = int(config.get("dp") or (world_size // rest if rest > 0 else 0))
    except (TypeError, ValueError):
        return None
    grid = Grid(tp=t, cp=c, dp=d, pp=p)
    if min(t, c, d, p) < 1 or grid.world != world_size:
        return None
    return grid
