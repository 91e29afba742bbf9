"""The diff call graphs, one SVG per scope (``diff-callgraph.svg``, ``diff-callgraph-1.svg``,
...), drawn through graphviz by :mod:`viz.render.diffgraph_svg`."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from . import DiffInput

PHASE = "drawing the diff call graphs"


def render(diff: DiffInput, report_dir: str) -> list:
    """Write every diff call graph into ``report_dir``; the paths written. Raises
    :class:`viz.render.callgraph_svg.RenderError` if graphviz fails (before writing any)."""
    svgs, files = diff.svgs, diff.svg_files
    os.makedirs(report_dir, exist_ok=True)
    written = []
    for scope, svg in svgs.items():
        written.append(os.path.join(report_dir, files[scope]))
        with open(written[-1], "w", encoding="utf-8") as fh:
            fh.write(svg)
    return written
