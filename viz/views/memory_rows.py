"""The report's memory: on the front page a line per rank with its peak, the step it came in,
and what was live at it by category (a stacked bar); on a rank's page what was live at its
peak by category, module, phase and source line. From each rank's
viz.analysis.memory.MemoryProfile (memory is recorded by default); no I/O."""
from __future__ import annotations

from typing import Optional

from ..analysis.run_analysis import RunAnalysis
from .formatters import fmt_bytes

# the categories in the order the bars stack them, each with its colour
COLOURS = {"parameters": "#4c72b0", "gradients": "#dd8452", "optimizer_state": "#55a868",
           "activations": "#c44e52", "temporaries": "#8c8c8c", "comm": "#937860"}
LISTED = 10              # modules and source lines listed on a rank's page


def memory_table(analysis: RunAnalysis) -> dict:
    """``rows``: a row per rank with memory recorded, ``{rank, peak, step, bar, text}``
    (``bar``: (category, percent of the largest peak of any rank, colour)); ``colours``: the
    categories with their colours; empty rows where no rank recorded memory."""
    profiles = {r: a.memory for r, a in sorted(analysis.ranks.items()) if a.memory is not None}
    top = max((p.peak_bytes for p in profiles.values()), default=0) or 1
    rows = []
    for rank, p in profiles.items():
        at = p.at_peak["category"]
        bar = [(c, 100 * at.get(c, 0) / top, colour) for c, colour in COLOURS.items()
               if at.get(c, 0) > 0]
        text = ", ".join(f"{c.replace('_', ' ')} {fmt_bytes(b)}" for c, b in at.items() if b > 0)
        rows.append(dict(rank=rank, peak=fmt_bytes(p.peak_bytes),
                         step="" if p.peak_step is None else str(p.peak_step), bar=bar,
                         text=text))
    return dict(rows=rows, colours=list(COLOURS.items()))


def rank_memory(profile) -> Optional[dict]:
    """A rank's memory peak for its page: ``peak``, ``step``, and (name, bytes, share) rows of
    what was live by category, module, phase and source line (the largest first, LISTED of
    each); None without memory."""
    if profile is None:
        return None
    peak = profile.peak_bytes or 1
    at = profile.at_peak

    def rows(pairs, none: str) -> list:
        return [(none if name is None else name, fmt_bytes(b), f"{100 * b / peak:.0f} %")
                for name, b in list(pairs)[:LISTED] if b > 0]
    return dict(peak=fmt_bytes(profile.peak_bytes),
                step="" if profile.peak_step is None else str(profile.peak_step),
                categories=rows(at["category"].items(), ""),
                modules=rows(at["module"].items(), "(no module)"),
                phases=rows(at["phase"].items(), "(no op)"),
                sites=rows(at["site"], "(no op: found on a module or optimizer)"),
                own_peaks=[(c.replace("_", " "), fmt_bytes(b))
                           for c, b in profile.category_peaks.items() if b > 0])
