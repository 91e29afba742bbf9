"""A real torch.profiler export taken with ``profile_memory=True`` (CPU), imported with
``trace-report --kineto``: its memory peak against a count made from the export's JSON apart,
its categories told by phase against the model's own tensors (gradients, AdamW's state, what
autograd saves), and the report's memory table."""
from __future__ import annotations

import json

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from support.cli import run
from support.kineto_exports import json_memory_peak
from viz.views.formatters import fmt_bytes

pytestmark = pytest.mark.integration


def test_an_export_with_memory_gets_its_peak(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 64))
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(16, 64)
    saved: dict = {}                 # what autograd saves in one forward, counted apart

    def pack(tensor):
        storage = tensor.untyped_storage()
        saved[storage.data_ptr()] = storage.nbytes()
        return tensor
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(x).square().mean()
    del loss
    params = [p.data_ptr() for p in model.parameters()] + [x.data_ptr()]
    kept = sum(b for ptr, b in saved.items() if ptr not in params)   # made in the forward
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
    # told by phase: every gradient alive at the optimizer step, AdamW's exp_avg and
    # exp_avg_sq and its step tensors (made in the first profiled step), and what autograd
    # saved plus the 4-byte loss, alive until the backward frees them
    peaks = memory["category_peaks"]
    assert peaks["gradients"] == sum(p.numel() * 4 for p in model.parameters())
    assert peaks["optimizer_state"] == sum(v.nbytes for state in opt.state.values()
                                           for v in state.values())
    assert peaks["activations"] == kept + 4 and kept == (16 * 128 + 16 * 64) * 4
    assert peaks["parameters"] == 0         # made before the profile: never seen
    page = (out / "index.html").read_text()
    assert "Memory at each rank" in page and "not tensors" in page


def test_an_exports_peak_is_named_as_made_within_it_beside_torchs_total(tmp_path):
    """A second profile of the same process: AdamW's state, made while the first profiled
    memory, is alive throughout the second but allocated before it. The peak of what the export
    made leaves it out; torch's own "Total Allocated" holds it, and both are shown, named
    (issue 50: 336.6 MiB made within an H100 export read as the process's peak, torch's total
    allocated peaking at 558.4 MiB)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, 64))
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(16, 64)

    def step() -> None:
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True):
        step()                                   # AdamW's state made here
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
        step()
    export = tmp_path / "e.json"
    prof.export_chrome_trace(str(export))
    state = sum(v.nbytes for s in opt.state.values() for v in s.values())
    events = json.loads(export.read_text())["traceEvents"]
    totals = [e["args"]["Total Allocated"] for e in events if e.get("name") == "[memory]"]
    out = tmp_path / "report"
    proc = run("trace-report", out, "--kineto", export)
    assert proc.returncode == 0, proc.stderr[-2000:]
    memory = json.loads((out / "summary.json").read_text())["ranks"]["0"]["memory"]
    assert memory["scope"] == "export"
    assert memory["peak_bytes"] == json_memory_peak(events)
    assert memory["allocated_peak_bytes"] == max(totals)
    # torch's count holds what this process allocated while memory was profiled before (here
    # at least AdamW's state; an earlier test's profile in the same process adds its own)
    assert memory["allocated_peak_bytes"] - memory["peak_bytes"] >= state > 0
    page = (out / "index.html").read_text()
    assert "made within the export" in page
    assert f"total allocated peaked at {fmt_bytes(max(totals))}" in page
    rank_page = (out / "ranks" / "rank-0.html").read_text()
    assert "The peak of memory made within the export" in rank_page
