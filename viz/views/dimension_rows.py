"""The front page's communication by parallel dimension: per rank, each dimension's exposed and
overlapped time a mean counted step, its calls and bytes (viz.analysis.crossrank.dimensions), in
words ("tp: 38 ms exposed; dp: 2 ms; pp: 11 ms") and as a table whose heads keep the user's own
names beside each dimension ("dp (dp_shard)"); and how each dimension's groups were named, groups of
one rank apart (no traffic). Built from a :class:`viz.analysis.RunAnalysis` alone; no I/O."""
from __future__ import annotations

from collections import defaultdict

from tracer.vocab.groups import group_label

from ..analysis.crossrank.dimensions import FROM_GRID, FROM_NAME, dimension_label
from ..analysis.run_analysis import RunAnalysis
from .formatters import fmt_bytes, fmt_count, fmt_time

ORDER = ("tp", "sp", "cp", "ep", "dp", "pp", "world", "other")
SOURCES = {FROM_NAME: "named", FROM_GRID: "by the rank grid"}
MAX_GROUPS = 4           # groups listed per dimension and way of naming


def dimension_table(analysis: RunAnalysis) -> dict:
    """``dims``: the dimensions any rank communicated on, in :data:`ORDER`; ``heads``: each
    with the user's names of its groups beside it; ``rows``: a row per rank with
    communication, ``{rank, cells, text}``, each cell None or ``{exposed, overlapped, comm,
    calls, bytes}`` (times a mean counted step; calls and bytes over the counted steps);
    ``named``: per dimension, how its groups were read."""
    present = {c.dimension for costs in analysis.dimensions.values() for c in costs}
    dims = _ordered(present)
    names: dict = defaultdict(list)
    for costs in analysis.dimensions.values():
        for c in costs:
            names[c.dimension].extend(c.names)
    rows = []
    for rank in sorted(analysis.dimensions):
        costs = {c.dimension: c for c in analysis.dimensions[rank]}
        if not costs:
            continue
        metrics = analysis.metrics.get(rank)
        steps = max(len(metrics.counted_steps), 1) if metrics is not None else 1
        cells = [_cell(costs.get(d), steps) for d in dims]
        text = "; ".join(f"{d}: {cell['exposed']} exposed" for d, cell in zip(dims, cells)
                         if cell is not None)
        rows.append(dict(rank=rank, cells=cells, text=text))
    return dict(dims=dims, heads=[dimension_label(d, names[d]) for d in dims], rows=rows,
                named=_named(analysis, dims))


def _ordered(dims) -> list:
    return [d for d in ORDER if d in dims] + sorted(set(dims) - set(ORDER))


def _cell(cost, steps: int):
    if cost is None:
        return None
    return dict(exposed=fmt_time(cost.exposed_s / steps * 1e9),
                overlapped=fmt_time(cost.overlapped_s / steps * 1e9),
                comm=fmt_time(cost.comm_s / steps * 1e9), calls=fmt_count(cost.count),
                bytes=fmt_bytes(cost.bytes))


def _named(analysis: RunAnalysis, dims: list) -> list:
    """Per dimension of ``dims`` (those with traffic), a text of its groups and how each was
    named: ``tp: [0,1], [2,3] (named tp)``; groups of one rank apart, of any dimension, ``dp:
    [0], [1]: groups of one rank, no traffic (named dp_shard)``."""
    by: dict = defaultdict(list)
    for text, g in sorted(analysis.group_dimensions.items()):
        alone = g.size == 1
        if not alone and g.dimension not in dims:
            continue
        how = f"named {', '.join(g.names or (g.desc,))}" if g.source == FROM_NAME else \
            SOURCES.get(g.source, "by its ranks")
        by[(g.dimension, alone, how)].append(f"[{group_label(text)}]")
    out = []
    for d in _ordered({dim for dim, _, _ in by}):
        parts = []
        for (dim, alone, how), labels in sorted(by.items()):
            if dim != d:
                continue
            shown = ", ".join(labels[:MAX_GROUPS]) + (
                f" and {len(labels) - MAX_GROUPS} more" if len(labels) > MAX_GROUPS else "")
            one = f": {'a group' if len(labels) == 1 else 'groups'} of one rank, no traffic" \
                if alone else ""
            parts.append(f"{shown}{one} ({how})")
        out.append(f"{d}: {'; '.join(parts)}")
    return out
