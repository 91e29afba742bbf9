"""The recorder's device-time plumbing, without a GPU: CUPTI windows that follow the steps (run
with torch.profiler's CPU activity standing in for CUDA, so the windowing, the export, the
flusher's parsing and the clock pairs all run for real), the metadata that maps CUPTI's clock
and threads onto the trace, the process-group setup event, and the option that turns it off.
What only a GPU can show (CUDA kernels attributed to ops) is in test_device_gpu.py."""
from __future__ import annotations

import glob
import os
import subprocess
import sys
import threading

import torch
import torch.distributed as dist

import tracer
from conftest import CPU_ONLY
from gpt_helpers import REPO, free_port
from instrument.cli import Target, build_parser, worker_args
from tracer import device as device_module
from tracer import ops, rundir
from tracer import session as session_module
from tracer.device import DeviceRecorder
from tracer.device_format import read_device


def _train(steps: int) -> None:
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        opt.zero_grad()


def _cpu_stands_in_for_cuda(monkeypatch) -> None:
    monkeypatch.setattr(session_module, "cuda_in_use", lambda: True)
    monkeypatch.setattr(DeviceRecorder, "activity", "CPU")
    monkeypatch.setattr(device_module, "WINDOW_S", 0.0)     # a window per recorded step


def test_device_windows_follow_the_recorded_steps(tmp_path, monkeypatch):
    _cpu_stands_in_for_cuda(monkeypatch)
    with tracer.trace(str(tmp_path), steps="1-2"):
        _train(5)
    trace = tracer.load(rundir.trace_file(str(tmp_path), 0))
    # steps 1 and 2 each had a window (started at their boundary, cut at the next); step 0 and
    # steps 3, 4 had none
    assert trace.meta["device_time"] == {"source": "cupti", "windows": 2, "error": None}
    pairs = trace.meta["clock_pairs"]
    assert len(pairs) == 2 + 2 * 2                  # the session's start and end, each window's
    assert [p["perf_ns"] for p in pairs] == sorted(p["perf_ns"] for p in pairs)
    assert all(b["unix_ns"] - a["unix_ns"] >= 0 for a, b in zip(pairs, pairs[1:]))
    assert pairs[0]["perf_ns"] <= trace.meta["start_ns"] and pairs[-1]["perf_ns"] <= \
        trace.meta["end_ns"]
    # every window was exported, parsed by the flusher into the device file, then removed
    records, metas, problem = read_device(rundir.device_file(str(tmp_path), 0))
    assert problem is None and [m["window"] for m in metas] == [0, 1]
    assert len(records) == 0                        # CPU ops are no GPU activity
    assert glob.glob(os.path.join(str(tmp_path), ".*window*")) == []


def test_a_running_profiler_keeps_the_recorder_to_host_time(tmp_path, monkeypatch, capfd):
    _cpu_stands_in_for_cuda(monkeypatch)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        with tracer.trace(str(tmp_path)):
            _train(3)
    trace = tracer.load(rundir.trace_file(str(tmp_path), 0))
    assert trace.meta["device_time"]["error"] == \
        "torch.profiler is already running in this process"
    err = capfd.readouterr().err
    assert err.count("torch.profiler already holds CUPTI") == 1      # said once, not per step
    assert not os.path.exists(rundir.device_file(str(tmp_path), 0))
    assert trace.status == "ok" and len(trace) > 0


def test_device_time_off_records_no_device_file(tmp_path, monkeypatch):
    _cpu_stands_in_for_cuda(monkeypatch)
    with tracer.trace(str(tmp_path), device_time=False):
        _train(3)
    trace = tracer.load(rundir.trace_file(str(tmp_path), 0))
    assert trace.meta["options"]["device_time"] is False
    assert trace.meta["device_time"] is None
    assert not os.path.exists(rundir.device_file(str(tmp_path), 0))
    assert len(trace.meta["clock_pairs"]) == 2


def test_threads_map_the_thread_column_to_host_thread_ids(tmp_path):
    # (dispatch modes are per thread: on the CPU everything here runs on this one; on CUDA the
    # autograd engine's device threads run backward ops and get their own numbers)
    with tracer.trace(str(tmp_path)):
        _train(2)
    trace = tracer.load(rundir.trace_file(str(tmp_path), 0))
    assert trace.meta["threads"] == {"0": threading.get_ident()}
    assert set(trace.col("thread").tolist()) == {0}


def test_process_group_setup_is_an_event(tmp_path):
    with tracer.trace(str(tmp_path)):
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}",
                                rank=0, world_size=1)
        try:
            dist.all_reduce(torch.ones(4))
        finally:
            dist.destroy_process_group()
    trace = tracer.load(rundir.trace_file(str(tmp_path), 0))
    op = trace.col("op")
    setup = op == trace.code("op", ops.OP_PG_INIT)
    assert setup.sum() == 1
    (row,) = setup.nonzero()[0]
    t0, t1 = trace.col("t0")[row], trace.col("t1")[row]
    assert 0 < t0 < t1
    reduce = (trace.col("kind") == trace.code("kind", "all_reduce")).nonzero()[0]
    assert len(reduce) == 1 and trace.col("t0")[reduce[0]] >= t1
    assert trace.meta["backend"] == "gloo"


def test_trace_run_passes_no_device_time_to_its_workers():
    target = Target(script="train.py", module=None, args=["--x"])
    args = build_parser().parse_args(["--no-device-time", "train.py"])
    assert "--no-device-time" in worker_args(args, "/tmp/out", target)
    args = build_parser().parse_args(["train.py"])
    assert "--no-device-time" not in worker_args(args, "/tmp/out", target)


WINDOWS_UNDER_GC = """
import gc, sys, tempfile, torch
import tracer
from tracer import device as device_module, session as session_module
from tracer.device import DeviceRecorder
session_module.cuda_in_use = lambda: True
DeviceRecorder.activity = "CPU"
device_module.WINDOW_S = 0.0
model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(8):
    with tempfile.TemporaryDirectory() as out:
        with tracer.trace(out):
            for i in range(20):
                model(torch.randn(4, 8)).sum().backward()
                opt.step()                    # a window edge inside the step's profiler range
                opt.zero_grad()
                if i % 3 == 0:
                    gc.collect()
print("ok")
"""


def test_windows_never_start_inside_a_record_function_range():
    # torch 2.13 crashes (SIGSEGV while collecting garbage) when a profiler started inside a
    # record_function range outlives the range; optimizer steps run their hooks inside one.
    # Before the fix this script crashed on every run.
    proc = subprocess.run([sys.executable, "-c", WINDOWS_UNDER_GC], capture_output=True,
                          text=True, timeout=300, cwd=REPO, env={**os.environ, **CPU_ONLY})
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
