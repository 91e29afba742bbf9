"""modules.html: the nn.Module tree of all ranks over the training steps (ops, FLOPs, time,
communication), each module linked to its zoomed call graph where it has one."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ...views.formatters import steps_text
from ..page_writer import PageWriter

if TYPE_CHECKING:
    from . import ReportInput

PHASE = "writing pages"


def render(report: ReportInput, report_dir: str) -> list:
    """Write ``report_dir/modules.html``; its path."""
    views = report.views
    report.progress.expect(1)
    path = PageWriter(report_dir).write(
        "modules.html", "modules.html", title="Module view", rows=views.tree,
        links={path: f"callgraphs/{os.path.basename(p.rel)}"
               for path, p in views.module_zooms.items()},
        world=tuple(sorted(report.analysis.ranks)),    # the ranks the module tables sum over
        steps=steps_text(views.split.counted))
    report.progress.advance()
    return [path]
