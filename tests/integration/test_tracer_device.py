"""The recorder's device-time plumbing, without a GPU: CUPTI windows that follow the steps (run
with torch.profiler's CPU activity standing in for CUDA, so the windowing, the export, the
parsing and the clock pairs all run for real), where each window is saved (the training
thread, before the next window starts) and parsed (the flusher, or the worker), the same exports through
torch.autograd's binding as through torch.profiler, the metadata that maps CUPTI's clock and
threads onto the trace, the process-group setup event, and the option that turns it off. The
device worker that parses the windows: test_device_worker.py. What only a GPU can show (CUDA
kernels attributed to ops): test_device_gpu.py."""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import threading

import pytest
import torch
import torch.distributed as dist

import tracer
from support.cli import CPU_ONLY
from support.gpt_helpers import free_port
from instrument.launch.command_line import Target, build_parser, worker_args
from tracer.files import rundir
from tracer.files.device_format import read_device
from tracer.recorder.device import kineto_windows as device_module, device_notes
from tracer.recorder import flusher as flusher_module
from tracer.recorder.patches import profiler as profiler_patch
from tracer.recorder.device.kineto_windows import DeviceRecorder
from tracer.vocab import ops
from support.paths import REPO
from support.device_windows import (STAND_IN_SCRIPT, cpu_stands_in_for_cuda, cuda_mlp_steps,
                                    train, windows_of_three_steps)


def test_device_windows_follow_the_recorded_steps(tmp_path, monkeypatch):
    cpu_stands_in_for_cuda(monkeypatch)
    with tracer.trace(str(tmp_path), steps="1-2"):
        train(5)
    trace = tracer.load(rundir.trace_file(str(tmp_path), 0))
    # steps 1 and 2 each had a window (started at their boundary, cut at the next); step 0 and
    # steps 3, 4 had none
    assert trace.meta["device_time"] == {"source": "cupti", "windows": 2, "error": None,
                                         "errors": 0}
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


def _spy_on_windows(monkeypatch) -> tuple:
    """Record, per window, the thread that saved its export and the thread that parsed it,
    and the export's complete events as json reads them (not paratrace's parser); and, in
    ``order``, each window's start and each save as they happened. The parse these spies see
    is the in-process one (the path before, and the worker's fallback)."""
    monkeypatch.setattr(DeviceRecorder, "parse_in", "flusher")
    saved, parsed, order = [], [], []
    export, load = DeviceRecorder._export, device_module.load_chrome_trace

    def spy_export(self, save, path):
        export(self, save, path)
        saved.append((os.path.basename(path), threading.current_thread()))
        order.append("save")

    def spy_load(path, *args, **kwargs):
        with open(path) as fh:
            events = json.load(fh)["traceEvents"]
        parsed.append((os.path.basename(path), threading.current_thread(),
                       [(e.get("cat"), e["name"]) for e in events if e.get("ph") == "X"]))
        return load(path, *args, **kwargs)
    for window in (device_module.BindingWindow, device_module.ProfilerWindow):
        monkeypatch.setattr(window, "start", lambda self, _start=window.start: (
            order.append("start"), _start(self)))
    monkeypatch.setattr(DeviceRecorder, "_export", spy_export)
    monkeypatch.setattr(device_module, "load_chrome_trace", spy_load)
    return saved, parsed, order


def test_each_window_is_saved_before_the_next_starts_and_parsed_by_the_flusher(
        tmp_path, monkeypatch):
    # on CUDA a window saved after the next one was enabled loses every CUPTI time (Kineto
    # clamps them to 0; tracer/recorder/device/kineto_windows.py): the training thread saves at
    # the cut
    cpu_stands_in_for_cuda(monkeypatch)
    saved, parsed, order = _spy_on_windows(monkeypatch)
    windows_of_three_steps(str(tmp_path))
    names = [f".rank-0.window-{i}.json" for i in range(3)]
    assert [name for name, _ in saved] == names and [p[0] for p in parsed] == names
    assert order == ["start", "save"] * 3
    assert all(thread is threading.main_thread() for _, thread in saved)
    assert all(p[1].name == "paratrace-flusher" for p in parsed)
    assert all(len(p[2]) > 0 for p in parsed)          # each window held the CPU ops
    _, metas, problem = read_device(rundir.device_file(str(tmp_path), 0))
    assert problem is None and [m["window"] for m in metas] == [0, 1, 2]
    assert glob.glob(os.path.join(str(tmp_path), ".*window*")) == []


def test_saving_on_the_flusher_is_what_the_order_check_catches(tmp_path, monkeypatch):
    # the path before (export_at "flusher"): a window's save came after the next start
    cpu_stands_in_for_cuda(monkeypatch)
    monkeypatch.setattr(DeviceRecorder, "export_at", "flusher")
    saved, _, order = _spy_on_windows(monkeypatch)
    windows_of_three_steps(str(tmp_path))
    assert len(saved) == 3 and order != ["start", "save"] * 3
    assert {thread.name for _, thread in saved} == {"paratrace-flusher"}


def test_the_binding_and_torch_profiler_export_the_same_windows(tmp_path, monkeypatch):
    # the first path (torch.profiler, stopped and exported at the cut on the training thread)
    # and the binding (the same, without torch.profiler's wrapper), on the same seeded training
    cpu_stands_in_for_cuda(monkeypatch)
    saved, parsed, _ = _spy_on_windows(monkeypatch)
    runs = {}
    for path in ("torch.profiler", "binding"):
        monkeypatch.setattr(DeviceRecorder, "window_path", path)
        del saved[:], parsed[:]
        torch.manual_seed(0)
        windows_of_three_steps(str(tmp_path / path))
        records, metas, problem = read_device(rundir.device_file(str(tmp_path / path), 0))
        assert problem is None
        runs[path] = ([p[2] for p in parsed], metas, records,
                      {thread.name for _, thread in saved})
    before, now = runs["torch.profiler"], runs["binding"]
    assert len(now[0]) == 3 and now[0] == before[0]      # every window's events, in order
    assert now[1] == before[1] and len(now[2]) == len(before[2])
    assert before[3] == now[3] == {"MainThread"}


def test_without_the_binding_torch_profiler_runs_the_windows(tmp_path, monkeypatch):
    # a torch without torch.autograd's binding: torch.profiler, saved at the cut all the same
    cpu_stands_in_for_cuda(monkeypatch)
    monkeypatch.setattr(device_module, "binding", lambda: None)
    made = []
    start = device_module.ProfilerWindow.start
    monkeypatch.setattr(device_module.ProfilerWindow, "start",
                        lambda self: (made.append(self), start(self)))
    saved, parsed, order = _spy_on_windows(monkeypatch)
    windows_of_three_steps(str(tmp_path))
    assert len(made) == 3 and order == ["start", "save"] * 3 and [p[0] for p in parsed] == \
        [f".rank-0.window-{i}.json" for i in range(3)]
    assert {thread.name for _, thread in saved} == {"MainThread"}
    _, metas, problem = read_device(rundir.device_file(str(tmp_path), 0))
    assert problem is None and [m["window"] for m in metas] == [0, 1, 2]


def test_a_crash_still_writes_every_window(tmp_path, monkeypatch):
    # the flusher never gets to the windows (it writes only at close here): the training
    # raises in its fifth step, a window under way and the four of steps 0-3 saved, not yet
    # parsed; closing saves the fifth and parses all five
    cpu_stands_in_for_cuda(monkeypatch)
    monkeypatch.setattr(flusher_module, "STEP_FLUSH_GAP", 1000.0)
    saved, parsed, _ = _spy_on_windows(monkeypatch)
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(RuntimeError, match="the training failed"):
        with tracer.trace(str(tmp_path), flush_interval=1000.0):
            for step in range(5):
                model(torch.randn(4, 8)).sum().backward()
                if step == 4:
                    raise RuntimeError("the training failed")
                opt.step()
                opt.zero_grad()
    trace = tracer.load(rundir.trace_file(str(tmp_path), 0))
    assert trace.status == "failed" and trace.meta["device_time"]["windows"] == 5
    _, metas, problem = read_device(rundir.device_file(str(tmp_path), 0))
    assert problem is None and [m["window"] for m in metas] == [0, 1, 2, 3, 4]
    assert [p[0] for p in parsed] == [f".rank-0.window-{i}.json" for i in range(5)]
    assert {thread.name for _, thread in saved} == {"MainThread"}    # each at its cut
    assert glob.glob(os.path.join(str(tmp_path), ".*window*")) == []


def test_a_window_that_is_not_saved_costs_only_itself(tmp_path, monkeypatch):
    # the second and third windows' exports fail (a full disk): the first failure said in the
    # metadata, both counted, the other window kept
    cpu_stands_in_for_cuda(monkeypatch)
    export = DeviceRecorder._export

    def failing(self, save, path):
        if path.endswith(("window-1.json", "window-2.json")):
            raise OSError(28, "No space left on device")
        export(self, save, path)
    monkeypatch.setattr(DeviceRecorder, "_export", failing)
    windows_of_three_steps(str(tmp_path))
    trace = tracer.load(rundir.trace_file(str(tmp_path), 0))
    assert trace.status == "ok" and trace.meta["device_time"] == {
        "source": "cupti", "windows": 3, "errors": 2,
        "error": "a device window was not saved ([Errno 28] No space left on device)"}
    _, metas, problem = read_device(rundir.device_file(str(tmp_path), 0))
    assert problem is None and [m["window"] for m in metas] == [0]
    # the report's problems say it, once for the rank
    from viz.analysis import analyse
    from viz.run import open_run
    assert analyse(open_run(str(tmp_path))).ranks[0].warnings == [
        "device time: a device window was not saved ([Errno 28] No space left on device) "
        "(and 1 more error)"]
    assert glob.glob(os.path.join(str(tmp_path), ".*window*")) == []


# ---------------------------------------------------------------- the device worker
# Windows with GPU activity, without a GPU: the real H100 export (tests/assets/gpu-h100) cut
# into parts, each saved in place of a window's CPU export (torch's save still runs first)


@pytest.mark.gpu
def test_on_cuda_the_binding_records_the_kernels_torch_profiler_did(tmp_path, monkeypatch):
    # the same steps recorded both ways on a GPU: three windows each, and in them the same
    # kernels, memcpys and memsets by name (written without a GPU: first run by a GPU session)
    from tracer.files.device_format import KINDS
    monkeypatch.setenv("PARATRACE_DEVICE_SOURCE", "kineto")    # the windows, not the default
    monkeypatch.setattr(device_module, "WINDOW_S", 0.0)
    steps = cuda_mlp_steps()
    got = {}
    for path in ("torch.profiler", "binding"):
        monkeypatch.setattr(DeviceRecorder, "window_path", path)
        with tracer.trace(str(tmp_path / path), steps="1-3"):
            steps(5)
            torch.cuda.synchronize()
        records, metas, problem = read_device(rundir.device_file(str(tmp_path / path), 0))
        assert problem is None and [m["window"] for m in metas] == [0, 1, 2]
        work = records.kind < KINDS.index("runtime")
        got[path] = sorted((KINDS[k], records.names[n])
                           for k, n in zip(records.kind[work], records.name[work]))
    assert got["binding"] and got["binding"] == got["torch.profiler"]


def test_a_running_profiler_keeps_the_recorder_to_host_time(tmp_path, monkeypatch, capfd):
    cpu_stands_in_for_cuda(monkeypatch)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        with tracer.trace(str(tmp_path)):
            train(3)
    trace = tracer.load(rundir.trace_file(str(tmp_path), 0))
    assert trace.meta["device_time"]["error"] == \
        "torch.profiler is already running in this process"
    err = capfd.readouterr().err
    assert err.count("torch.profiler already holds CUPTI") == 1      # said once, not per step
    assert not os.path.exists(rundir.device_file(str(tmp_path), 0))
    assert trace.status == "ok" and len(trace) > 0


def _train_with_a_profiler_over_iterations_2_and_3(out: str):
    """Six iterations recorded, the user's torch.profiler started before iteration 2 and
    stopped before iteration 4; returns the user's profile."""
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    profile = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    with tracer.trace(out):
        for iteration in range(6):
            if iteration == 2:
                profile.start()
            if iteration == 4:
                profile.stop()
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
            opt.zero_grad()
    return profile


def test_a_profiler_started_while_recording_gets_kinetos_session_to_itself(tmp_path,
                                                                          monkeypatch, capfd):
    # without the patch, the window's stop after the user's profiler crashed the process
    # (SIGSEGV, torch 2.13 and 2.14.1) or raised in the training loop (2.10, 2.11), and a
    # window stopped while it ran left the user's profile empty (device_notes.py)
    cpu_stands_in_for_cuda(monkeypatch)
    profile = _train_with_a_profiler_over_iterations_2_and_3(str(tmp_path))
    # the user's profile is whole: iterations 2 and 3, one Linear forward each
    assert sum(e.name == "aten::linear" for e in profile.events()) == 2
    trace = tracer.load(rundir.trace_file(str(tmp_path), 0))
    assert trace.status == "ok"
    meta = trace.meta["device_time"]
    assert meta["error"] == device_notes.PROFILER_STARTED and meta["errors"] == 1
    assert capfd.readouterr().err.count(device_notes.PROFILER_STARTED) == 1
    # a window per recorded step but while the profiler ran: steps 0 and 1, step 2 (ended as
    # the profiler started), then the step begun at iteration 4's optimizer step and the last
    records, metas, problem = read_device(rundir.device_file(str(tmp_path), 0))
    assert problem is None and [m["window"] for m in metas] == list(range(5))
    assert meta["windows"] == 5


def test_a_scheduled_profiler_gets_its_warm_up_and_active_steps_to_itself(tmp_path,
                                                                          monkeypatch):
    # the warm-up prepares the user's session without enabling it: a window started then
    # would cancel it (Kineto: "Cancelling current trace request")
    cpu_stands_in_for_cuda(monkeypatch)
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    forwards = []
    profile = torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU],
        schedule=torch.profiler.schedule(wait=1, warmup=1, active=2, repeat=1),
        on_trace_ready=lambda p: forwards.append(
            sum(e.name == "aten::linear" for e in p.events())))
    with tracer.trace(str(tmp_path)), profile:
        for _ in range(7):
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
            opt.zero_grad()
            profile.step()
    assert forwards == [2]                     # its two active iterations, whole
    trace = tracer.load(rundir.trace_file(str(tmp_path), 0))
    meta = trace.meta["device_time"]
    assert meta["error"] == device_notes.PROFILER_STARTED and meta["errors"] == 1
    records, metas, problem = read_device(rundir.device_file(str(tmp_path), 0))
    assert problem is None and len(metas) == meta["windows"] >= 3   # before it, after it


def test_without_the_patch_a_window_the_profiler_ended_is_lost_not_a_crash(tmp_path,
                                                                         monkeypatch):
    cpu_stands_in_for_cuda(monkeypatch)
    monkeypatch.setattr(profiler_patch, "install", lambda patches, session: None)
    monkeypatch.setattr(device_module, "WINDOW_S", 3600.0)   # one window over the profiler
    _train_with_a_profiler_over_iterations_2_and_3(str(tmp_path))
    trace = tracer.load(rundir.trace_file(str(tmp_path), 0))
    assert trace.status == "ok"
    assert trace.meta["device_time"]["error"] == \
        "a device window was lost (another torch.profiler ended its session)"


def test_device_time_off_records_no_device_file(tmp_path, monkeypatch):
    cpu_stands_in_for_cuda(monkeypatch)
    with tracer.trace(str(tmp_path), device_time=False):
        train(3)
    trace = tracer.load(rundir.trace_file(str(tmp_path), 0))
    assert trace.meta["options"]["device_time"] is False
    assert trace.meta["device_time"] is None
    assert not os.path.exists(rundir.device_file(str(tmp_path), 0))
    assert len(trace.meta["clock_pairs"]) == 2


def test_threads_map_the_thread_column_to_host_thread_ids(tmp_path):
    # (dispatch modes are per thread: on the CPU everything here runs on this one; on CUDA the
    # autograd engine's device threads run backward ops and get their own numbers)
    with tracer.trace(str(tmp_path)):
        train(2)
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
""" + STAND_IN_SCRIPT + """for _ in range(8):
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
