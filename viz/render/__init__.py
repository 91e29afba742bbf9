"""Renderers: writers only. Every output is written by a renderer of one shape, a module with
one entry point::

    render(inputs, report_dir: str) -> list[str]      # the paths it wrote

``inputs`` is one object of what the command computed: :class:`viz.render.report.ReportInput`
(the analysis, the report's views, the readable sources), :class:`viz.render.diff.DiffInput`
(a diff), :class:`viz.render.whatif.WhatIfInput` (a what-if). The renderers are grouped by
command, each group's ``RENDERERS`` its registry, in the order they run: :mod:`.report`
(summary.json, the HTML report and its pictures, the Chrome trace), :mod:`.diff` (the terminal
table, diff.json, diff.html and its call graphs), :mod:`.whatif` (whatif.json, its page, the
predicted timelines). A command only orders the steps: parse, open, analyse, build the views,
then :func:`render_all` of its registry.

Shared pieces, at this level: the jinja2 pages (:mod:`.page_writer`), the progress on the terminal
(:mod:`.progress`), and what several renderers or other programs draw: call graphs through
graphviz (:mod:`.callgraph_svg`, :mod:`.diffgraph_svg`), the timeline picture
(:mod:`.timeline_svg`) and its Chrome trace (:mod:`.timeline_json`), summary.json's document
(:mod:`.summary_schema`). No renderer aggregates traces or reads another's output; a drawing
several renderers show is drawn once and kept on the inputs; the number formats they share are
:mod:`viz.views.formatters`.
"""
from __future__ import annotations

from contextlib import nullcontext
from itertools import groupby
from typing import Iterable, Optional, Protocol


class Renderer(Protocol):
    """A renderer module. ``PHASE`` (optional): the progress line it runs under; consecutive
    renderers of one phase share it (``inputs.progress``)."""

    def render(self, inputs, report_dir: Optional[str]) -> list:
        """Write this output of ``inputs`` into ``report_dir``; the paths written."""


def render_all(renderers: Iterable[Renderer], inputs, report_dir: Optional[str]) -> list:
    """Run ``renderers`` in order on ``inputs``; every path they wrote."""
    paths: list = []
    for phase, group in groupby(renderers, key=lambda r: getattr(r, "PHASE", None)):
        with inputs.progress.phase(phase) if phase else nullcontext():
            for renderer in group:
                paths += renderer.render(inputs, report_dir)
    return paths


def inline_svg(svg: str) -> str:
    """An SVG document without its XML prolog and DOCTYPE, to embed in an HTML page."""
    start = svg.find("<svg")
    return svg[start:] if start >= 0 else svg
