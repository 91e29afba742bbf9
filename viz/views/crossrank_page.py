"""What the report's cross-rank page shows (``crossrank.html``): a heat map of each rank's
wait per step, the stragglers, each collective's bandwidth with its source line, the ranks that
disagree, and each step's critical path. Rows and texts only, from a RunAnalysis
(:mod:`viz.analysis.crossrank.matching`, :mod:`viz.analysis.crossrank.critical_path`); the template
draws them."""
from __future__ import annotations

from tracer.vocab.groups import group_ranks, process_group_name

from ..analysis.run_analysis import RunAnalysis
from .formatters import fmt_bytes, fmt_rate, fmt_time
from .problems import mismatch_text


def headline(analysis: RunAnalysis) -> str:
    """One sentence for the front page."""
    cross = analysis.cross
    late = cross.stragglers()
    parts = [f"{len(cross.matched):,} collectives matched across ranks"]
    if late:
        rank, seconds = late[0]
        parts.append(f"rank {rank} made the others wait longest ({fmt_time(seconds * 1e9)})")
    real = [m for m in cross.mismatches if m.what != "unknown"]
    if real:
        parts.append(f"{len(real)} disagreement{'s' if len(real) != 1 else ''} between ranks")
    if analysis.paths:
        p = max(analysis.paths, key=lambda p: p.ns)
        rank, ns = max(p.by_rank().items(), key=lambda kv: kv[1]) if p.segments else (0, 0)
        parts.append(f"the longest step's critical path ({fmt_time(p.ns)}) ran "
                     f"{100 * ns / (p.ns or 1):.0f} % on rank {rank}")
    return "; ".join(parts) + "."


def heat_map(analysis: RunAnalysis) -> dict:
    """Rank x step wait, each cell with its share of the largest one (the colour)."""
    waits = analysis.cross.wait_by_step
    steps = sorted({s for _, s in waits})
    ranks = sorted(analysis.ranks)
    top = max(waits.values(), default=0) or 1
    rows = [dict(rank=r, cells=[dict(text=fmt_time(waits.get((r, s), 0)),
                                     level=waits.get((r, s), 0) / top) for s in steps])
            for r in ranks]
    return dict(steps=steps, rows=rows)


def stragglers(analysis: RunAnalysis) -> list:
    """Every rank: how long the others waited for it, how long it waited for them."""
    late = dict(analysis.cross.stragglers())
    return [dict(rank=r, late=fmt_time(late.get(r, 0.0) * 1e9),
                 wait=fmt_time(analysis.cross.wait_ns.get(r, 0)))
            for r in sorted(analysis.ranks, key=lambda r: (-late.get(r, 0.0), r))]


def bandwidth(analysis: RunAnalysis, paths: dict, href) -> list:
    """The collectives table (:meth:`viz.analysis.crossrank.matching.CrossRank.collectives`), each
    row with its source line linked."""
    out = []
    for c in analysis.cross.collectives():
        file, line = (c.site.file, c.site.line) if c.site is not None else ("", 0)
        out.append(dict(kind=c.kind, group=list(group_ranks(c.group)),
                        process_group=process_group_name(c.group), count=c.count,
                        algbw=fmt_rate(_bytes_per_s(c.algbw_GBps)),
                        busbw=fmt_rate(_bytes_per_s(c.busbw_GBps)),
                        bytes_text=fmt_bytes(c.bytes), median_text=fmt_time(c.median_s * 1e9),
                        where=f"{paths.get(file, file)}:{line}" if file else "",
                        href=href(file, line) if file and line >= 0 else None))
    return out


def _bytes_per_s(gbps):
    return None if gbps is None else gbps * 1e9


def mismatches(analysis: RunAnalysis, most: int = 100) -> list:
    """The disagreements between ranks, one line each, the first ``most``."""
    return [mismatch_text(m) for m in analysis.cross.mismatches[:most]]


def paths_rows(analysis: RunAnalysis) -> list:
    """Each step's critical path: its length and where it went, by rank, kind and module."""
    out = []
    for p in analysis.paths:
        total = p.ns or 1
        out.append(dict(step=p.step, end_rank=p.end_rank, length=fmt_time(p.ns),
                        ranks=[(r, 100 * ns / total) for r, ns in p.by_rank().items()],
                        kinds=[(k, 100 * ns / total) for k, ns in p.by_what().items()],
                        modules=[(m, 100 * ns / total) for m, ns in sorted(
                            p.modules.items(), key=lambda kv: -kv[1])[:5]]))
    return out
