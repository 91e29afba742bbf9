"""What the predictions know of a recording: its execution graph, each rank's step cut into
parts, the models fitted on it, and the lines saying how well those models describe it.

:func:`study` takes the pieces of a :class:`viz.analysis.RunAnalysis` it needs (the timeline,
the matched collectives, each rank's counted op groups), so it works on any analysed run:
recorded by paratrace, or a torch.profiler export once imported as trace files.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ...analysis.timeline.grid import Grid, grid_of
from ...analysis.timeline.lanes import counted_steps
from ..replay.graph import ExecutionGraph, execution_graph
from ..replay.models import CollectiveModel, LinkModel, OpCostModel
from .anatomy import anatomy
from .costs import PartCosts, part_costs
from .megatron import Shape, role_of, roles, shape_of


@dataclass
class Recording:
    """A recording, studied once for every target."""

    graph: ExecutionGraph
    anatomies: dict                  # rank -> viz.whatif.reference_gpt.anatomy.RankAnatomy
    config: dict
    world: int
    grid: Optional[Grid]
    shape: Optional[Shape]
    link: LinkModel
    collectives: CollectiveModel
    ops: OpCostModel
    costs: Optional[PartCosts]

    def pp_rank(self, rank: int) -> int:
        return self.grid.coords(rank)[3] if self.grid is not None else 0

    def model_lines(self) -> list:
        """How well each fitted model describes this recording, one line each."""
        lines = [self.link.describe()] if self.link.fit.samples else \
            ["P2P link: no P2P recorded"]
        lines += [f"collective {line}" for line in self.collectives.describe()] or \
            ["collectives: none matched across ranks"]
        lines.append(f"op cost: {self.ops.describe()}")
        if self.costs is not None:
            c = self.costs
            err = "n/a" if c.error is None else f"{100 * c.error:.0f}%"
            lines.append(
                f"pass compute from modules: layer F {c.layer['F'] / 1e6:.2f} ms, B "
                f"{c.layer['B'] / 1e6:.2f} ms; embedding F {c.embedding['F'] / 1e6:.2f} ms; "
                f"head F {c.head['F'] / 1e6:.2f} ms, B {c.head['B'] / 1e6:.2f} ms; host time "
                f"per op F {c.gap_ns.get('F', 0) / 1e3:.1f} us, B "
                f"{c.gap_ns.get('B', 0) / 1e3:.1f} us; {err} mean miss on the recorded passes")
            lines.append(f"weight-gradient share of a layer's backward: "
                         f"{100 * c.weight_share:.0f}% ("
                         + ("measured W passes)" if c.weight_share_measured else
                            "half its linear layers' backward)"))
        return lines


def study(timeline, matched: list, groups: dict, world: int,
          late: frozenset = frozenset(), backend: Optional[str] = None) -> Recording:
    """``timeline``: the run's viz.analysis.timeline.lanes.Timeline; ``matched``: viz.analysis.crossrank.matching's
    matched collectives; ``groups``: rank -> its op groups over its counted steps; ``world``: the
    run's world size; ``late``: the ranks whose completions may have come late
    (viz.whatif.replay.waits.late_completions); ``backend``: the process groups' backend, when every
    rank recorded the same (gloo runs some collectives as others: viz.whatif.replay.models)."""
    graph = execution_graph(timeline, matched, late)
    config = graph.config = recorded_config(timeline, world)
    grid = grid_of(config, world)
    anatomies = anatomy(graph)
    shape = shape_of(config)
    link = LinkModel.from_graph(graph)
    collectives = CollectiveModel.from_graph(
        graph, link, backend,
        (lambda c: role_of(c.group, roles(grid, c.members[0]))) if grid is not None else None)
    ops = OpCostModel.from_groups([g for mine in groups.values() for g in mine])
    costs = None
    if shape is not None and grid is not None:
        costs = part_costs(anatomies, groups, shape, lambda r: grid.coords(r)[3])
    return Recording(graph, anatomies, config, world, grid, shape, link, collectives, ops,
                     costs)


def recorded_config(timeline, world: int) -> dict:
    """The run's recorded config; where it names no schedule, the one
    torch.distributed.pipelining ran in every counted step (tracer.recorder.frameworks.pipelining
    records it), with tp 1 and the world's remaining ranks as DP."""
    config = dict(timeline.config)
    if config.get("schedule") and config.get("pp"):
        return config
    found = {lane.schedules.get(step) for lane in timeline.ranks.values()
             for step in counted_steps(lane)}
    if len(found) != 1 or None in found:
        return config
    schedule, pp, m, v = found.pop()
    config.update(schedule=schedule, pp=pp, microbatches=m, virtual_stages=v)
    config.setdefault("tp", 1)
    config.setdefault("dp", max(world // (int(config["tp"]) * pp), 1))
    return config
