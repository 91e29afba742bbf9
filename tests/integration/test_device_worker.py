"""The recorder's device worker, without a GPU: windows of the real H100 export
(tests/assets/gpu-h100) cut into parts and saved in place of each window's CPU export; the
worker writes the records the in-process parse wrote; its death, a close that waits for it, a
file cut short, a killed rank."""
from __future__ import annotations

import glob
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from decimal import Decimal

import torch

import tracer
from support.cli import CPU_ONLY
from tracer.files import rundir
from tracer.files.device_format import KINDS, read_device
from tracer.recorder.device import kineto_windows as device_module, window_worker as device_worker
from tracer.recorder.device.kineto_windows import DeviceRecorder
from support.waiting import alive, wait_until
from support.paths import GPU_FIXTURE, REPO
from support.device_windows import (STAND_IN_SCRIPT, cpu_stands_in_for_cuda, train,
                                    windows_of_three_steps)


KINETO_FIXTURE = str(GPU_FIXTURE / "kineto.json.gz")


LAUNCH_KINDS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset",
                "cuda_runtime": "runtime", "cuda_driver": "driver"}


def _gpu_window_exports(directory, parts: int) -> list:
    """The fixture's events cut into ``parts`` exports, each with its top-level fields."""
    with gzip.open(KINETO_FIXTURE, "rt", encoding="utf-8") as fh:
        export = json.load(fh)
    events = export.pop("traceEvents")
    paths = []
    for i in range(parts):
        path = os.path.join(str(directory), f"gpu-window-{i}.json")
        with open(path, "w") as fh:
            json.dump({**export, "traceEvents": events[i::parts]}, fh)
        paths.append(path)
    return paths


def _expected_records(path: str) -> list:
    """(kind, name, start ns, end ns) of an export's GPU activity and launches, from json with
    exact decimals (not paratrace's parser), in the export's order."""
    with open(path) as fh:
        export = json.load(fh, parse_float=Decimal)
    base = export["baseTimeNanoseconds"]
    out = []
    for e in export["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") in LAUNCH_KINDS:
            start = base + int(Decimal(e["ts"]) * 1000)
            out.append((LAUNCH_KINDS[e["cat"]], e["name"], start,
                        start + int(Decimal(e["dur"]) * 1000)))
    return out


def _rows(records) -> list:
    return [(KINDS[k], records.names[n], int(s), int(e))
            for k, n, s, e in zip(records.kind, records.name, records.start, records.end)]


def _columns(records) -> dict:
    return {f: getattr(records, f).tolist() for f in
            ("kind", "start", "end", "device", "stream", "corr", "tid", "nbytes")} | \
        {"names": [records.names[n] for n in records.name]}


def _save_gpu_windows(monkeypatch, exports: list) -> None:
    """Each window's export, once torch saved it, replaced by ``exports[window % len]``."""
    export = DeviceRecorder._export

    def gpu_export(self, save, path):
        export(self, save, path)
        shutil.copyfile(exports[_window_numbers([path])[0] % len(exports)], path)
    monkeypatch.setattr(DeviceRecorder, "_export", gpu_export)


def _window_numbers(names: list) -> list:
    """The window numbers of export names (``.rank-0.window-<N>.json``)."""
    return [int(name.rsplit("window-", 1)[1].split(".")[0]) for name in names]


def _watch_workers(monkeypatch) -> tuple:
    """The DeviceWorkers the recorder starts, and the in-process parses, in one list each."""
    made, parsed = [], []

    class Watched(device_worker.DeviceWorker):
        def __init__(self, *args):
            super().__init__(*args)
            made.append(self)
    load = device_module.load_chrome_trace
    monkeypatch.setattr(device_module, "DeviceWorker", Watched)
    monkeypatch.setattr(device_module, "load_chrome_trace",
                        lambda path, *a: (parsed.append(os.path.basename(path)),
                                          load(path, *a))[1])
    return made, parsed


def test_the_worker_writes_what_the_in_process_parse_wrote(tmp_path, monkeypatch):
    cpu_stands_in_for_cuda(monkeypatch)
    exports = _gpu_window_exports(tmp_path, 3)
    _save_gpu_windows(monkeypatch, exports)
    made, parsed = _watch_workers(monkeypatch)
    runs = {}
    for where in ("flusher", "worker"):
        monkeypatch.setattr(DeviceRecorder, "parse_in", where)
        del parsed[:]
        torch.manual_seed(0)
        windows_of_three_steps(str(tmp_path / where))
        trace = tracer.load(rundir.trace_file(str(tmp_path / where), 0))
        assert trace.meta["device_time"] == {"source": "cupti", "windows": 3, "error": None,
                                             "errors": 0}
        runs[where] = read_device(rundir.device_file(str(tmp_path / where), 0)), list(parsed)
        assert glob.glob(str(tmp_path / where / ".*window*")) == []
    (here, metas_here, problem_here), parsed_here = runs["flusher"]
    (there, metas_there, problem_there), parsed_there = runs["worker"]
    # the worker parsed every window (none here); one worker, started once, exited cleanly
    assert len(parsed_here) == 3 and parsed_there == []
    assert len(made) == 1 and made[0].proc.returncode == 0 and not made[0].sent
    # the same batches, metadata and columns; the records json reads in the exports
    assert problem_here is None and problem_there is None
    assert metas_there == metas_here == [
        {"window": i, "devices": ["NVIDIA H100 80GB HBM3"]} for i in range(3)]
    assert _columns(there) == _columns(here)
    expected = [r for path in exports for r in _expected_records(path)]
    assert len(expected) == 3455 + 1158 + 259 + 249 + 68         # the fixture's, by category
    assert _rows(there) == expected


def test_a_dead_worker_falls_back_and_loses_no_window(tmp_path, monkeypatch, capfd):
    # the worker is stopped after its first window, two more windows are sent to it, then it
    # is killed: the recorder takes the file it left, parses those two and the rest itself
    cpu_stands_in_for_cuda(monkeypatch)
    exports = _gpu_window_exports(tmp_path, 3)
    _save_gpu_windows(monkeypatch, exports)
    made, parsed = _watch_workers(monkeypatch)
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out = str(tmp_path / "run")
    with tracer.trace(out, steps="1-5") as session:
        for step in range(7):                # windows 0-4: steps 1-5, each cut after its step
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
            opt.zero_grad()
            if step == 1:
                wait_until(lambda: made, "the worker's start")
                os.kill(made[0].proc.pid, signal.SIGSTOP)
            if step == 3:
                worker = made[0]
                wait_until(lambda: 1 in worker.sent and 2 in worker.sent,
                           "windows 1 and 2 sent to the stopped worker")
                os.kill(worker.proc.pid, signal.SIGKILL)
        device = session._device
    assert made[0].proc.returncode == -signal.SIGKILL and len(made) == 1   # none started again
    # here: the two it held and every later one, and window 0 if it had not appended it; once
    here = _window_numbers(parsed)
    assert {1, 2, 3, 4} <= set(here) <= {0, 1, 2, 3, 4} and len(here) == len(set(here))
    trace = tracer.load(rundir.trace_file(out, 0))
    assert trace.meta["device_time"]["windows"] == 5
    assert trace.meta["device_time"]["error"].startswith(
        "the device worker stopped (killed by signal 9) with")
    assert capfd.readouterr().err.count("the device worker stopped") == 1
    records, metas, problem = read_device(rundir.device_file(out, 0))
    assert problem is None and [m["window"] for m in metas] == [0, 1, 2, 3, 4]
    assert _rows(records) == [r for i in range(5) for r in _expected_records(exports[i % 3])]
    assert glob.glob(os.path.join(out, ".*window*")) == [] and device._worker is None


def test_close_waits_for_the_worker(tmp_path, monkeypatch):
    # the worker is stopped until closing has begun to wait for it: every window is in the
    # file when the session has closed, and the worker has exited
    cpu_stands_in_for_cuda(monkeypatch)
    exports = _gpu_window_exports(tmp_path, 3)
    _save_gpu_windows(monkeypatch, exports)
    made, parsed = _watch_workers(monkeypatch)
    waiting = threading.Event()
    wait = device_worker.DeviceWorker.wait

    def spy_wait(self, timeout):
        waiting.set()
        return wait(self, timeout)
    monkeypatch.setattr(device_worker.DeviceWorker, "wait", spy_wait)

    def resume_once_closing_waits():
        waiting.wait(300)
        os.kill(made[0].proc.pid, signal.SIGCONT)
    out = str(tmp_path / "run")
    with tracer.trace(out, steps="1-3"):
        train(2)
        wait_until(lambda: made, "the worker's start")
        os.kill(made[0].proc.pid, signal.SIGSTOP)
        thread = threading.Thread(target=resume_once_closing_waits)
        thread.start()
        train(4)
    thread.join()
    assert waiting.is_set() and made[0].proc.returncode == 0 and parsed == []
    trace = tracer.load(rundir.trace_file(out, 0))
    assert trace.meta["device_time"] == {"source": "cupti", "windows": 3, "error": None,
                                             "errors": 0}
    records, metas, problem = read_device(rundir.device_file(out, 0))
    assert problem is None and [m["window"] for m in metas] == [0, 1, 2]
    assert _rows(records) == [r for path in exports for r in _expected_records(path)]
    assert glob.glob(os.path.join(out, ".*window*")) == []


def test_a_worker_that_does_not_finish_keeps_the_exports(tmp_path, monkeypatch):
    # the worker stays stopped: closing waits close_wait_s, stops it, keeps the exports of
    # the windows it had not appended and says so; the file keeps those it had
    cpu_stands_in_for_cuda(monkeypatch)
    monkeypatch.setattr(DeviceRecorder, "close_wait_s", 0.5)
    exports = _gpu_window_exports(tmp_path, 3)
    _save_gpu_windows(monkeypatch, exports)
    made, parsed = _watch_workers(monkeypatch)
    out = str(tmp_path / "run")
    with tracer.trace(out, steps="1-3"):
        train(2)
        wait_until(lambda: made, "the worker's start")
        os.kill(made[0].proc.pid, signal.SIGSTOP)
        train(4)
    assert made[0].proc.returncode == -signal.SIGKILL and parsed == []
    kept = sorted(glob.glob(os.path.join(out, ".*window*")))
    _, metas, problem = read_device(rundir.device_file(out, 0)) \
        if os.path.exists(rundir.device_file(out, 0)) else (None, [], None)
    written = [m["window"] for m in metas]
    assert problem is None and written in ([], [0])         # window 0: before the stop or not
    assert [os.path.basename(p) for p in kept] == \
        [f".rank-0.window-{i}.json" for i in range(3) if i not in written]
    error = tracer.load(rundir.trace_file(out, 0)).meta["device_time"]["error"]
    assert error.startswith(f"the device worker had not parsed {len(kept)} windows after 0.5 s")
    assert kept[-1] in error
    for path in kept:                # each kept export is the window's, whole
        i = _window_numbers([path])[0]
        assert _expected_records(path) == _expected_records(exports[i % 3])


def test_resume_keeps_the_complete_windows_of_a_file_cut_short(tmp_path):
    # a worker killed while appending its third window: the file ends inside that batch
    exports = _gpu_window_exports(tmp_path, 3)
    path = str(tmp_path / "rank-0.device.arrow")
    appender = device_worker.WindowAppender(path, 0)
    sizes = []
    for i, export in enumerate(exports):
        shutil.copyfile(export, str(tmp_path / "w.json"))
        assert appender.append(i, str(tmp_path / "w.json")) is None
        sizes.append(os.path.getsize(path))
    appender.close()
    whole = read_device(path)
    with open(path, "r+b") as fh:
        fh.truncate((sizes[1] + sizes[2]) // 2)
    assert read_device(path)[2] is not None                     # the reader sees the cut
    resumed, done = device_worker.WindowAppender.resume(path, 0)
    assert done == {0, 1} and not os.path.exists(path + ".resume")
    shutil.copyfile(exports[2], str(tmp_path / "w.json"))
    assert resumed.append(2, str(tmp_path / "w.json")) is None
    resumed.close()
    records, metas, problem = read_device(path)
    assert problem is None and metas == whole[1] and _columns(records) == _columns(whole[0])


KILLED_WITH_ITS_WINDOWS = """
import os, signal, subprocess, sys, torch
""" + STAND_IN_SCRIPT + """with tracer.trace(sys.argv[1], steps="1-3") as session:
    for step in range(4):
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
    device = session._device
    device.write_pending()                  # windows 0-2 go to the worker now
    worker = device._worker
    # a process that outlives this one holding the worker's stdin: no end of file for it
    holder = subprocess.Popen(["sleep", "600"], pass_fds=[worker.proc.stdin.fileno()],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    print(worker.proc.pid, holder.pid, sorted(worker.sent), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_killed_rank_leaves_no_worker_behind(tmp_path):
    proc = subprocess.run([sys.executable, "-c", KILLED_WITH_ITS_WINDOWS, str(tmp_path)],
                          capture_output=True, text=True, timeout=300, cwd=REPO,
                          env={**os.environ, **CPU_ONLY})
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    worker, holder, sent = proc.stdout.split(" ", 2)
    try:
        wait_until(lambda: not alive(int(worker)), "the worker's exit")
    finally:
        os.kill(int(holder), signal.SIGKILL)
    # what it had been sent and not yet answered, it appended before leaving
    _, metas, problem = read_device(rundir.device_file(str(tmp_path), 0))
    assert problem is None and [m["window"] for m in metas] == [0, 1, 2]
    assert json.loads(sent) == [i for i in range(3) if i in json.loads(sent)]
    assert glob.glob(os.path.join(str(tmp_path), ".*window*")) == []
