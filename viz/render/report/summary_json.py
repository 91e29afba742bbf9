"""summary.json (schema ``paratrace.summary/1``): the analysis's digest as
:mod:`viz.render.summary_schema` spells it, written beside the report (which links it, and
reads the analysis, not this file)."""
from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

from tracer.files import rundir

from ..summary_schema import build_summary

if TYPE_CHECKING:
    from . import ReportInput


def render(report: ReportInput, report_dir: str) -> list:
    """Write ``report_dir/summary.json``; its path."""
    os.makedirs(report_dir, exist_ok=True)
    path = os.path.join(report_dir, rundir.SUMMARY)
    with open(path, "w") as fh:
        json.dump(build_summary(report.analysis), fh, indent=1)
    return [path]
