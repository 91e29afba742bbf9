"""M, the measures whatif.json gives of a configuration (measured, replayed or predicted), from
the timeline metrics (:mod:`viz.analysis.timeline.metrics`) of its run: per rank the mean counted step,
the share of it without compute (summary.json's ``bubble_fraction``), the exposed communication
per step and the pipeline bubble; over ranks the slowest rank's step and the means of the others
(whatif.json's M: docs/architecture.md's contract, docs/whatif.md)."""
from __future__ import annotations

from typing import Optional

def rank_measures(m) -> dict:
    """One rank's measures from its :class:`viz.analysis.timeline.metrics.RankMetrics`."""
    n = len(m.counted_steps) or 1
    return {"step_s": m.wall_s / n, "bubble_fraction": m.bubble_fraction,
            "exposed_comm_s": m.exposed_comm_s / n, "compute_s": m.compute_s / n,
            "pipeline_bubble_fraction": m.pipeline.bubble_fraction if m.pipeline else None}


def measures(metrics: dict) -> dict:
    """M of a run: ``metrics`` is rank -> RankMetrics."""
    ranks = {str(r): rank_measures(m) for r, m in sorted(metrics.items())}
    rows = list(ranks.values())
    return {"step_s": max((x["step_s"] for x in rows), default=None),
            "bubble_fraction": _mean(x["bubble_fraction"] for x in rows),
            "exposed_comm_s": _mean(x["exposed_comm_s"] for x in rows),
            "pipeline_bubble_fraction": _mean(x["pipeline_bubble_fraction"] for x in rows),
            "ranks": ranks}


def _mean(values) -> Optional[float]:
    have = [v for v in values if v is not None]
    return sum(have) / len(have) if have else None
