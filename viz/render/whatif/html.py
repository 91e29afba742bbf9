"""whatif.html: the targets ranked by predicted step time beside the recorded configuration
(measured and replayed), each with what it changed, its bubble and exposed communication, its
peak memory (a recording made with ``--memory``; the replayed row is the memory model's own
prediction of the recorded configuration), the
assumptions it took and its predicted timeline; and how well the fitted models describe the
recording. Reads only the viz.whatif.WhatIf it is given."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

from ..page_writer import PageWriter

if TYPE_CHECKING:
    from . import WhatIfInput

OPTIONS = ("tp", "sp", "pp", "dp", "schedule", "virtual_stages", "microbatches")


def _row(name: str, measures: dict, base_step, kind: str, memory=None, **extra) -> dict:
    step = measures.get("step_s")
    peaks = [(int(r), m["peak_bytes"]) for r, m in (memory or {}).items()]
    change = (step / base_step - 1) if step is not None and base_step else None
    return {"name": name, "kind": kind, "step_s": step, "change": change,
            "bubble": measures.get("bubble_fraction"),
            "pipeline": measures.get("pipeline_bubble_fraction"),
            "exposed_s": measures.get("exposed_comm_s"),
            "ranks": sorted(measures.get("ranks", {}).items(), key=lambda kv: int(kv[0])),
            # the largest peak memory of any rank (trace-run --memory), and which rank
            "memory": max(peaks, key=lambda p: p[1]) if peaks else None,
            **extra}


def _rows(whatif: WhatIfInput) -> list:
    """The base (measured, replayed) and every target, fastest predicted step first."""
    result = whatif.result
    base = result.measured.get("step_s")
    out = [_row("recorded configuration, measured", result.measured, base, "measured",
                result.memory),
           _row("recorded configuration, replayed", result.replayed, base, "replayed",
                result.memory_replayed, svg=whatif.REPLAY_SVG)]
    targets = [_row(t.title, t.measures, base, "predicted", t.memory,
                    svg=whatif.target_svg(i), assumptions=t.assumptions, config=t.config)
               for i, t in enumerate(result.targets)]
    targets.sort(key=lambda r: (r["step_s"] is None, r["step_s"] or 0.0))
    for rank, row in enumerate(targets, start=1):
        row["place"] = rank
    return out + targets


def render(whatif: WhatIfInput, out_dir: str) -> list:
    """Write ``out_dir/whatif.html``; its path."""
    result, run_dir = whatif.result, whatif.run_dir
    report = os.path.join(run_dir, "index.html")
    link = os.path.relpath(report, out_dir) if os.path.exists(report) else None
    return [PageWriter(out_dir).write(
        "whatif.html", "whatif.html", title="What if", rows=_rows(whatif),
        config=result.config, models=result.models, report=link, run_dir=run_dir,
        options=OPTIONS)]
