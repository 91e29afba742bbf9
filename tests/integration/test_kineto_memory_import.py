"""A real torch.profiler export taken with ``profile_memory=True`` (CPU), imported with
``trace-report --kineto``: its memory peak against a count made from the export's JSON apart,
and the report's memory table."""
from __future__ import annotations

import json

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from support.cli import run
from support.kineto_exports import json_memory_peak

pytestmark = pytest.mark.integration


def test_an_export_with_memory_gets_its_peak(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 64))
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(16, 64)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        for _ in range(3):
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
            prof.step()
    export = tmp_path / "e.json"
    prof.export_chrome_trace(str(export))
    out = tmp_path / "report"
    proc = run("trace-report", out, "--kineto", export)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    memory = summary["ranks"]["0"]["memory"]
    assert memory["peak_bytes"] == json_memory_peak(json.loads(export.read_text())["traceEvents"]) > 0
    assert set(k for k, v in memory["by_category"].items() if v) <= {"temporaries", "comm"}
    page = (out / "index.html").read_text()
    assert "Memory at each rank" in page and "not tensors" in page
