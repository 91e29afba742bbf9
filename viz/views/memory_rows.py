"""The report's memory: on the front page a line per rank with its peak, the step it came in,
and what was live at it by category (a stacked bar); on a rank's page what was live at its
peak by category, module, phase and source line. From each rank's
viz.analysis.memory.live_bytes.MemoryProfile (memory is recorded by default); no I/O."""
from __future__ import annotations

import re
from typing import Callable, Optional

from ..analysis.memory.live_bytes import EXPORT, peak_scope
from ..analysis.run_analysis import RunAnalysis
from .formatters import fmt_bytes

# the categories in the order the bars stack them, each with its colour
COLOURS = {"parameters": "#4c72b0", "gradients": "#dd8452", "optimizer_state": "#55a868",
           "activations": "#c44e52", "temporaries": "#8c8c8c", "comm": "#937860"}
LISTED = 10              # modules and source lines listed on a rank's page
# a source site as viz.analysis.memory.live_bytes names it: "file:line function"
SITE = re.compile(r"^(?P<file>.+):(?P<line>\d+) (?P<function>\S+)$")


def peak_label(meta: dict) -> str:
    """What a rank's peak is, for people: empty for a recording's; for an export's, "made
    within the export", with torch's own total-allocated peak where the export carries it."""
    scope = peak_scope(meta)
    if scope.scope != EXPORT:
        return ""
    label = "made within the export (what was allocated before it began is not in it)"
    if scope.allocated_peak is not None:
        label += f"; torch's total allocated peaked at {fmt_bytes(scope.allocated_peak)}"
    return label


def memory_table(analysis: RunAnalysis) -> dict:
    """``rows``: a row per rank with memory recorded, ``{rank, peak, scope, step, bar, text}``
    (``scope``: :func:`peak_label`; ``bar``: (category, percent of the largest peak of any
    rank, colour)); ``colours``: the categories with their colours; empty rows where no rank
    recorded memory."""
    profiles = {r: a.memory for r, a in sorted(analysis.ranks.items()) if a.memory is not None}
    top = max((p.peak_bytes for p in profiles.values()), default=0) or 1
    rows = []
    for rank, p in profiles.items():
        at = p.at_peak["category"]
        bar = [(c, 100 * at.get(c, 0) / top, colour) for c, colour in COLOURS.items()
               if at.get(c, 0) > 0]
        text = ", ".join(f"{c.replace('_', ' ')} {fmt_bytes(b)}" for c, b in at.items() if b > 0)
        rows.append(dict(rank=rank, peak=fmt_bytes(p.peak_bytes),
                         scope=peak_label(analysis.ranks[rank].meta),
                         step="" if p.peak_step is None else str(p.peak_step), bar=bar,
                         text=text))
    return dict(rows=rows, colours=list(COLOURS.items()))


def rank_memory(profile, meta: Optional[dict] = None,
                href: Optional[Callable[[str, int], Optional[str]]] = None,
                paths: Optional[dict] = None) -> Optional[dict]:
    """A rank's memory peak for its page: ``peak``, ``scope`` (:func:`peak_label` of the
    trace's ``meta``), ``step``, and (name, link, bytes, share) rows of what was live by
    category, module, phase and source line (the largest first, LISTED of each; a source line
    named by its display path (``paths``) and linked to its source page by ``href(file,
    line)``, where it has one); None without memory."""
    if profile is None:
        return None
    peak = profile.peak_bytes or 1
    at = profile.at_peak

    def rows(pairs, none: str, link=lambda name: (name, None)) -> list:
        return [(*link(name), fmt_bytes(b), f"{100 * b / peak:.0f} %") if name is not None
                else (none, None, fmt_bytes(b), f"{100 * b / peak:.0f} %")
                for name, b in list(pairs)[:LISTED] if b > 0]

    def site(name: str) -> tuple:
        found = SITE.match(name)
        if found is None:
            return name, None
        file, line = found["file"], int(found["line"])
        shown = f"{(paths or {}).get(file, file)}:{line} {found['function']}"
        return shown, href(file, line) if href is not None else None
    return dict(peak=fmt_bytes(profile.peak_bytes), scope=peak_label(meta or {}),
                step="" if profile.peak_step is None else str(profile.peak_step),
                categories=rows(at["category"].items(), ""),
                modules=rows(at["module"].items(), "(no module)"),
                phases=rows(at["phase"].items(), "(no op)"),
                sites=rows(at["site"], "(no op: found on a module or optimizer)", site),
                own_peaks=[(c.replace("_", " "), fmt_bytes(b))
                           for c, b in profile.category_peaks.items() if b > 0])
