"""The compute of a pass from the parts of the model it runs: per transformer layer, the
embedding and the head, per pass kind, from the recording's per-module op times.

A pass's measured compute is its ops plus the host time between them. Each rank's op groups
(:class:`viz.analysis.callgraphs.op_groups.OpGroup`, over its counted steps) give the op time and count of
each part by phase (forward ops ran in F passes, backward ops in B and W passes); the rest of the
passes' compute (host time, ops outside any module) is spread over the module ops, the same
amount per op (``gap_ns``). A part's cost per pass is then its op time plus its op count times
that, over the passes that ran it. Layers are taken as equal: the per-layer cost is the mean over
every recorded layer; the embedding and the head come from the ranks that ran them.

Tensor parallelism scales each op's time by the op-cost model (:class:`viz.whatif.replay.models
.OpCostModel`) at its work on the new shard
(:func:`viz.whatif.reference_gpt.megatron.shard_factor`); the host time per op stays.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..replay.models import OpCostModel, work_of
from .megatron import Shape, module_part, shard_factor

PHASE_KINDS = {"forward": ("F",), "backward": ("B", "W")}
_LINEAR = ("qkv", "proj", "fc1", "fc2")


@dataclass
class _Tally:
    time: float = 0.0         # op time, ns
    count: int = 0
    groups: list = field(default_factory=list)
    layers: set = field(default_factory=set)


@dataclass
class PartCosts:
    """Per pass kind ("F", "B": the whole backward, W included), the compute of one pass
    through one layer, the embedding, the head; the share of a backward that computes weight
    gradients; and the groups behind each, for rescaling by tensor parallelism."""

    layer: dict                       # kind -> ns
    embedding: dict
    head: dict
    gap_ns: dict                      # kind -> host time per op
    weight_share: float               # of a backward's compute: the W part
    weight_share_measured: bool
    groups: dict                      # (kind, part) -> [(op, shapes, module, calls per pass,
                                      #                   ns per call)]
    error: Optional[float] = None     # how far the parts miss the measured passes

    def part(self, kind: str, part: str) -> float:
        return {"layer": self.layer, "embedding": self.embedding, "head": self.head}[part] \
            .get(kind, 0.0)

    def pass_compute(self, kind: str, layers: int, first: bool, last: bool,
                     scale=None) -> float:
        """One pass's compute: ``scale(kind, part)`` multiplies each part (default 1)."""
        scale = scale or (lambda k, p: 1.0)
        return layers * self.part(kind, "layer") * scale(kind, "layer") \
            + (self.part(kind, "embedding") * scale(kind, "embedding") if first else 0.0) \
            + (self.part(kind, "head") * scale(kind, "head") if last else 0.0)

    def tp_scale(self, model: OpCostModel, shape: Shape, target: Shape):
        """scale(kind, part) for a pass on ``target``'s TP shard instead of ``shape``'s."""
        cache: dict = {}

        def scale(kind: str, part: str) -> float:
            if (kind, part) not in cache:
                old = new = 0.0
                for op, shapes, module, calls, each in self.groups.get((kind, part), []):
                    work = work_of(op, shapes)
                    factor = shard_factor(module, shape, target)
                    ratio = model.ratio(op, work, work * factor) if factor != 1 else 1.0
                    old += calls * each
                    new += calls * each * ratio
                host = self.part(kind, part) - old
                cache[(kind, part)] = (new + host) / (old + host) if old + host > 0 else 1.0
            return cache[(kind, part)]
        return scale


def part_costs(anatomies: dict, groups: dict, shape: Shape, pp_rank_of) -> Optional[PartCosts]:
    """The part costs of a recording: ``anatomies`` rank -> RankAnatomy, ``groups`` rank ->
    its counted op groups, ``pp_rank_of(rank)`` -> its pipeline rank. None when no pass ran
    an op of a layer module."""
    per = shape.layers // shape.stages
    sums: dict = {}                   # (kind, part) -> [ns per pass, samples, groups]
    gaps: dict = {}
    w_layer = []                      # a W pass's compute per layer
    for rank, anat in anatomies.items():
        passes: dict = {}
        for p in anat.passes:
            passes[(p.kind, p.chunk)] = passes.get((p.kind, p.chunk), 0) + 1
            if p.kind == "W":
                w_layer.append(p.body.compute / max(per, 1))
        for phase, kinds in PHASE_KINDS.items():
            compute = sum(p.body.compute for p in anat.passes if p.kind in kinds)
            tallies = _tallies(groups.get(rank) or [], phase, per, shape, pp_rank_of(rank))
            ops = sum(t.count for t in tallies.values())
            if not ops or not compute:
                continue
            gap = max((compute - sum(t.time for t in tallies.values())) / ops, 0.0)
            gaps.setdefault(kinds[0], []).append(gap)
            for (part, chunk), t in tallies.items():
                n = passes.get((kinds[0], chunk), 0)
                if n:
                    entry = sums.setdefault((kinds[0], part), [0.0, 0, []])
                    entry[0] += (t.time + t.count * gap) / n
                    entry[1] += len(t.layers) if part == "layer" else 1
                    entry[2] += [(op, shp, mod, calls / n, each)
                                 for op, shp, mod, calls, each in t.groups]
    if not any(k[1] == "layer" for k in sums):
        return None
    means = {key: (v[0] / v[1] if v[1] else 0.0) for key, v in sums.items()}
    gap_ns = {k: sum(v) / len(v) for k, v in gaps.items()}
    per_pass = {key: [(op, shp, mod, calls / max(v[1], 1), each)
                      for op, shp, mod, calls, each in v[2]]
                for key, v in sums.items()}
    layer_b = means.get(("B", "layer"), 0.0)
    if w_layer and layer_b > 0:
        share, measured = min(sum(w_layer) / len(w_layer) / layer_b, 1.0), True
    else:
        linear = sum(calls * (each + gap_ns.get("B", 0.0))
                     for _, _, mod, calls, each in per_pass.get(("B", "layer"), [])
                     if mod and mod.split(".")[-1] in _LINEAR)
        share, measured = (0.5 * linear / layer_b if layer_b > 0 else 0.0), False
    out = PartCosts({k: means.get((k, "layer"), 0.0) for k in ("F", "B")},
                    {k: means.get((k, "embedding"), 0.0) for k in ("F", "B")},
                    {k: means.get((k, "head"), 0.0) for k in ("F", "B")},
                    gap_ns, share, measured, per_pass)
    out.error = _error(out, anatomies, shape, pp_rank_of)
    return out


def _tallies(groups: list, phase: str, per: int, shape: Shape, pp_rank: int) -> dict:
    """(part, chunk) -> op time and count of the module ops of ``phase``."""
    out: dict = {}
    for g in groups:
        if g.kind is not None or g.phase != phase or not g.count:
            continue
        part, layer = module_part(g.module)
        if part == "other":
            continue
        if part == "layer":
            chunk = (layer // per) // shape.pp if per else 0
        else:
            chunk = 0 if part == "embedding" else shape.virtual_stages - 1
        t = out.setdefault((part, chunk), _Tally())
        t.time += g.time_ns
        t.count += g.count
        t.groups.append((g.op, g.shapes, g.module, g.count, g.time_ns / g.count))
        if layer is not None:
            t.layers.add(layer)
    return out


def _error(costs: PartCosts, anatomies: dict, shape: Shape, pp_rank_of) -> Optional[float]:
    """Time-weighted mean miss of the part model against every recorded F and B pass (with
    its W, where the recording split them)."""
    miss = total = 0.0
    for rank, anat in anatomies.items():
        pp_rank = pp_rank_of(rank)
        for p in anat.passes:
            if p.kind == "W":
                continue
            vs = shape.virtual_stage(pp_rank, p.chunk)
            layers = len(shape.layers_of(vs))
            model = costs.pass_compute(p.kind, layers, vs == 0, vs == shape.stages - 1)
            if p.kind == "B" and costs.weight_share_measured:
                model -= layers * costs.layer["B"] * costs.weight_share
            miss += abs(model - p.body.compute)
            total += p.body.compute
    return miss / total if total > 0 else None
