"""What a change cost: each run's step time, compute, exposed communication per parallel
dimension and memory peak by category, per step over the compared steps, side by side.

From the totals' profiles (:mod:`.profile`): times are the mean over ranks of each rank's sum
over the compared steps, divided by the steps summed; memory is the largest rank's peak over
those steps (the rank that runs out first), present only where every rank recorded it
(the default; not under ``--no-memory``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .profile import Memory, Profile


@dataclass(frozen=True)
class Cost:
    """One run's cost per step (seconds; None where it has no timeline)."""

    steps: int                     # the steps averaged over
    step_s: Optional[float]
    compute_s: Optional[float]
    exposed_comm_s: Optional[float]
    exposed_by_dimension: dict = field(default_factory=dict)   # dimension -> seconds
    memory: Optional[Memory] = None


def cost_of(profile: Profile) -> Cost:
    """The cost per step of a (merged) profile."""
    n = profile.time_steps

    def per_step(value: Optional[float]) -> Optional[float]:
        return value / n if value is not None and n else None

    exposed = {dim: per_step(seconds) for (dim, what), seconds in sorted(
        profile.dim_time.items()) if what == "exposed_s"}
    return Cost(n, per_step(profile.time.get("wall_s")), per_step(profile.time.get("compute_s")),
                per_step(profile.time.get("exposed_comm_s")), exposed, profile.memory)
