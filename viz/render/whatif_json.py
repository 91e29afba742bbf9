"""whatif.json: the recording's measures, its replay, and every target's prediction, as
docs/architecture.md's contract fixes them::

    {"schema": "paratrace.whatif/1",
     "base": {"config", "measured": M, "replayed": M, "models": [...],
              "timeline": "whatif/replay.svg"},
     "targets": [{"config", "changes", "title", "predicted": M, "assumptions": [...],
                  "timeline": "whatif/target-1.svg"}, ...]}

M = {"step_s", "bubble_fraction", "exposed_comm_s", "pipeline_bubble_fraction",
"ranks": {"R": {...the same per rank, and compute_s}}} (viz.whatif.measures).
"""
from __future__ import annotations

import json
import os

SCHEMA = "paratrace.whatif/1"


def svg_name(index: int) -> str:
    """The predicted timeline of target ``index`` (0-based), relative to the output dir."""
    return f"whatif/target-{index + 1}.svg"


REPLAY_SVG = "whatif/replay.svg"


def whatif_json(result) -> dict:
    """The JSON object of a viz.whatif.WhatIf."""
    return {"schema": SCHEMA,
            "base": {"config": result.config, "measured": result.measured,
                     "replayed": result.replayed, "models": result.models,
                     "timeline": REPLAY_SVG},
            "targets": [{"config": t.config, "changes": t.changes, "title": t.title,
                         "predicted": t.measures, "assumptions": t.assumptions,
                         "timeline": svg_name(i)} for i, t in enumerate(result.targets)]}


def write_whatif_json(result, out_dir: str) -> str:
    path = os.path.join(out_dir, "whatif.json")
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(whatif_json(result), fh, indent=1, sort_keys=False)
        fh.write("\n")
    return path
