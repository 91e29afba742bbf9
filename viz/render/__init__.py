"""Renderers: writers only. Each takes what the analyses and views computed (a
:class:`viz.analysis.RunAnalysis`, a diff, a what-if) and writes files: summary.json
(:mod:`.summary_json`), the HTML report (:mod:`.report` with :mod:`.html`), SVG through graphviz
(:mod:`.callgraph_svg`, :mod:`.diff_svg`) or by hand (:mod:`.timeline_svg`), the Chrome trace
(:mod:`.chrome_trace`), diff.json and diff.html, the what-if files, and the progress shown on
the terminal (:mod:`.progress`). No renderer aggregates traces or reads another's output; the
number formats they share are :mod:`viz.views.formatters`.
"""
from __future__ import annotations


def inline_svg(svg: str) -> str:
    """An SVG document without its XML prolog and DOCTYPE, to embed in an HTML page."""
    start = svg.find("<svg")
    return svg[start:] if start >= 0 else svg
