"""whatif.json: the recording's measures, its replay, and every target's prediction, as
docs/contract.md fixes them::

    {"schema": "paratrace.whatif/1",
     "base": {"config", "setup", "measured": M, "replayed": M, "models": [...],
              "timeline": "whatif/replay.svg", "memory": MEM, "memory_replayed": MEM},
     "targets": [{"config", "changes", "title", "predicted": M, "assumptions": [...],
                  "timeline": "whatif/target-1.svg", "memory": MEM,
                  "collectives": COMM}, ...]}

M = {"step_s", "bubble_fraction", "exposed_comm_s", "pipeline_bubble_fraction", "ranks": {"R":
{...the same per rank, and compute_s}}} (viz.whatif.replay.measures). MEM = {"R": {"peak_bytes",
"by_category": {category: bytes}}} per rank, or null when the recording has no memory
(viz.whatif.reference_gpt.gpt_memory, viz.whatif.memory.memory_replay). COMM = {"R": [{"kind",
"phase", "group", "dimension", "count", "bytes"}, ...]}: each rank's communications of one
predicted step, as summary.json's ``ranks.R.comm`` rows. ``setup``: the recorded setup in words,
read from the recording (viz.whatif.recorded.setup), or null.
"""
from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from . import WhatIfInput

SCHEMA = "paratrace.whatif/1"


def render(whatif: WhatIfInput, report_dir: str) -> list:
    """Write ``report_dir/whatif.json``; its path."""
    result = whatif.result
    document = {
        "schema": SCHEMA,
        "base": {"config": result.config, "setup": result.setup, "measured": result.measured,
                 "replayed": result.replayed, "models": result.models,
                 "timeline": whatif.REPLAY_SVG, "memory": result.memory,
                 "memory_replayed": result.memory_replayed},
        "targets": [{"config": t.config, "changes": t.changes, "title": t.title,
                     "predicted": t.measures, "assumptions": t.assumptions,
                     "timeline": whatif.target_svg(i), "memory": t.memory,
                     "collectives": t.collectives}
                    for i, t in enumerate(result.targets)]}
    path = os.path.join(report_dir, "whatif.json")
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(document, fh, indent=1, sort_keys=False)
        fh.write("\n")
    return [path]
