"""A predicted run's communications of one step per rank, shaped as summary.json's
``ranks.R.comm`` rows (kind, phase, group, dimension, count, bytes), from its simulation: for the
reference GPT's targets (viz.whatif.reference_gpt.plan), whose graphs say each communication's
role.

A launch inside an F pass is ``forward``, inside a B or W pass ``backward``; outside the
passes the gradient buckets, the sequence-parallel gradients' and the tied embedding's
all-reduces are ``grad_sync``, the loss's all-reduce ``other``. Dimensions follow the roles
(tp, dp, pp; the tied embedding's group is the pipeline's ends: pp).
"""
from __future__ import annotations

from collections import Counter

from ..replay.graph import ExecutionGraph

DIMENSIONS = {"tp": "tp", "dp": "dp", "bucket": "dp", "pp": "pp", "embedding": "pp"}
OUTSIDE = {"bucket": "grad_sync", "tp": "grad_sync", "embedding": "grad_sync", "dp": "other"}


def step_rows(graph: ExecutionGraph, sim) -> dict:
    """rank (str) -> the comm rows of its last simulated step."""
    out = {}
    for rank, run in sorted(sim.runs.items()):
        if not run.steps:
            continue
        last, start = run.steps[-1]
        spans = [(a, b, graph.passes[pid].kind) for pid, (a, b) in run.passes.items()
                 if graph.passes[pid].step == last]
        counts: Counter = Counter()
        sizes: Counter = Counter()
        for cid, t in run.launches:
            if t < start:
                continue
            comm = graph.comms[cid]
            kind = next((k for a, b, k in spans if a <= t <= b), None)
            phase = {"F": "forward", "B": "backward", "W": "backward"}.get(
                kind, OUTSIDE.get(comm.role, "other"))
            key = (comm.kind_on(rank), phase, tuple(comm.group),
                   DIMENSIONS.get(comm.role, "other"))
            counts[key] += 1
            sizes[key] += comm.nbytes
        out[str(rank)] = [{"kind": k, "phase": p, "group": list(g), "dimension": d,
                           "count": counts[(k, p, g, d)], "bytes": sizes[(k, p, g, d)]}
                          for k, p, g, d in sorted(counts)]
    return out
