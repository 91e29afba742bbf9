"""whatif.html: the targets ranked by predicted step time beside the recorded configuration
(measured and replayed; :mod:`viz.views.whatif_rows`), each with what it changed, its bubble
and exposed communication, its peak memory (a recording made with ``--memory``; the replayed
row is the memory model's own prediction of the recorded configuration), its communications
of one step (rank 0's), the assumptions it took and its predicted timeline; and how well the
fitted models describe the recording. Reads only the viz.whatif.WhatIf it is given."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ...views.whatif_rows import ranking, recorded_text
from ..page_writer import PageWriter

if TYPE_CHECKING:
    from . import WhatIfInput


def render(whatif: WhatIfInput, report_dir: str) -> list:
    """Write ``report_dir/whatif.html``; its path."""
    result, run_dir = whatif.result, whatif.run_dir
    report = os.path.join(run_dir, "index.html")
    link = os.path.relpath(report, report_dir) if os.path.exists(report) else None
    rows = ranking(result, whatif.REPLAY_SVG, whatif.target_svg)
    collectives = {t.title: (t.collectives or {}).get("0") for t in result.targets}
    return [PageWriter(report_dir).write(
        "whatif.html", "whatif.html", title="What if", rows=rows,
        recorded=recorded_text(result), models=result.models, report=link, run_dir=run_dir,
        collectives=collectives)]
