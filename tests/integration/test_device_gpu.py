"""Device time recorded for real on a GPU (``gpu`` marker: skipped cleanly without CUDA).

What the CPU suite cannot show: the recorder's device time (CUPTI driven directly, the default,
and Kineto's windows, the fallback) catches the CUDA kernels of a traced run, every kernel is
attributed to the op that launched it, and trace-run records the reference GPT on one GPU with
NCCL. Hardware timings (device time against torch.profiler's, the recorder's
cost) are benchmarks, not tests (docs/gpu.md).
"""
from __future__ import annotations

import json
import os

import pytest
import torch

import tracer
from tracer.files import rundir
from tracer.files.device_format import read_device
from viz.analysis.device.gpu_attribution import attribute
from viz.render.summary_schema import device_json
from support.cli import trace_run
from support.device_windows import cuda_mlp_steps
from support.paths import REPO

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("source, written", [("cupti", "cupti-direct"), ("kineto", "cupti")])
def test_the_recorder_attributes_every_kernel_of_a_traced_run(tmp_path, monkeypatch, source,
                                                              written):
    # CUPTI driven directly (the default) and Kineto's windows (the fallback), a window a step:
    # every window but the last is saved while the next one runs, where a save after the next
    # window's start loses every CUPTI time (tracer/recorder/device/kineto_windows.py). The direct
    # source has no windows: its batches follow CUPTI's flush period, not the steps
    monkeypatch.setenv("PARATRACE_DEVICE_SOURCE", source)
    monkeypatch.setattr("tracer.recorder.device.kineto_windows.WINDOW_S", 0.0)
    steps = cuda_mlp_steps(warm_up=0)
    with tracer.trace(str(tmp_path)):
        steps(4)
        torch.cuda.synchronize()
    trace = tracer.load(rundir.trace_file(str(tmp_path), 0))
    assert trace.meta["device_time"]["error"] is None
    assert trace.meta["device_time"]["source"] == written
    if source == "kineto":
        assert trace.meta["device_time"]["windows"] >= 3
    records, _, problem = read_device(rundir.device_file(str(tmp_path), 0))
    assert problem is None and len(records) > 0
    dev = attribute(trace, records)
    assert dev is not None and (dev.row >= 0).all(), "a kernel was left unattributed"
    ops = trace.dictionary("op")
    op_of = trace.col("op")[dev.row]
    gemm = [ops[op_of[i]] for i, n in enumerate(dev.name) if "gemm" in dev.names[n].lower()]
    assert gemm and all(name.startswith(("aten.mm", "aten.addmm", "aten.linear"))
                        for name in gemm), sorted(set(gemm))
    assert dev.row_ns.sum() > 0


def test_trace_run_records_the_reference_gpt_on_one_gpu(tmp_path):
    out = tmp_path / "run"
    proc = trace_run("--nproc-per-node", "1", "--out", out, "--no-report", "-m",
                     "sample_runs.train", "--tp", "1", "--pp", "1", "--no-sp", "--device", "cuda",
                     "--steps", "3", cwd=REPO, timeout=400, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr[-2000:]
    trace = tracer.load(rundir.trace_file(str(out / "traces"), 0))
    assert trace.meta["backend"] == "nccl"
    records, _, problem = read_device(rundir.device_file(str(out / "traces"), 0))
    assert problem is None and len(records) > 0
    dev = attribute(trace, records)
    summary = device_json(dev.summary(trace.dictionary("op"), trace.col("op")))
    assert summary["attributed"] == summary["activities"]
    # plain JSON, as summary.json carries it: it comes back equal (no tuple, no numpy number)
    assert json.loads(json.dumps(summary)) == summary
