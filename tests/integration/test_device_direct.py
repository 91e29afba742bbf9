"""The recorder on CUPTI's activity API without Kineto (tracer/recorder/device/cupti_direct.py),
without a GPU: a stand-in for the C module (what CUPTI's thread would have parsed) makes a
launch and its kernel wherever a custom op runs, on CUPTI's own clock; the session enables it
for the recorded steps only, the flusher drains it into the device file, and each kernel is
attributed to the op that launched it, in Unix time. On a GPU (``gpu`` marker), the same steps
recorded through Kineto's windows and through CUPTI directly give the same activities on the
same ops. The C module's parse and the real libcupti: tests/unit/test_cupti_direct.py; the
record layouts: test_cupti_layout.py."""
from __future__ import annotations

import json
import threading
import time
from collections import Counter

import numpy as np
import pytest
import torch

import tracer
from support.device_windows import cuda_mlp_steps
from tracer.files import rundir
from tracer.files.device_format import KINDS, read_device
from tracer.recorder.device import cupti_direct as device_direct, device_notes
from tracer.recorder import session as session_module
from viz.analysis.device.gpu_attribution import attribute
from viz.render.summary_schema import device_json

CUPTI_BEHIND_NS = 123_456_789      # the stand-in's clock: Unix time less this
KERNEL_NS = 5_000


class StandInCupti:
    """The C module's calls (tracer/recorder/csrc/cupti/cupti.c) over rows made by :meth:`launch`:
    a cudaLaunchKernel on the calling thread at its time, then its kernel, while enabled."""

    def __init__(self):
        self.lock = threading.Lock()
        self.rows: list = []
        self.names: list = []
        self.on = False
        self.starts = self.stops = self.forced_flushes = 0
        self.launched = 0

    def start(self, buffer_bytes: int, period_ms: int) -> None:
        assert buffer_bytes > 0 and period_ms > 0
        self.on, self.starts = True, self.starts + 1

    def stop(self) -> None:
        self.on, self.stops = False, self.stops + 1

    def flush(self, forced: bool) -> None:
        self.forced_flushes += bool(forced)

    def clock(self) -> tuple:
        unix = time.time_ns()
        return unix - CUPTI_BEHIND_NS, unix

    def own_clock(self) -> bool:
        return False            # CUPTI's clock is its own: paired at each drain

    def _name(self, name: str) -> int:
        if name not in self.names:
            self.names.append(name)
        return self.names.index(name)

    def launch(self, kernel: str) -> None:
        with self.lock:
            if not self.on:
                return
            self.launched += 1
            t = time.time_ns() - CUPTI_BEHIND_NS
            tid = threading.get_ident() & 0xFFFFFFFF
            self.rows.append((3, self._name("cudaLaunchKernel"), t, t + 1_000, -1, -1,
                              self.launched, tid, 0))
            self.rows.append((0, self._name(kernel), t + 2_000, t + 2_000 + KERNEL_NS, 0, 7,
                              self.launched, 0, 0))

    def drain(self, known: int) -> tuple:
        with self.lock:
            rows, self.rows = self.rows, []
            fresh = self.names[known:]
        data = np.array(rows, dtype=device_direct.ROW).tobytes() if rows else b""
        return data, fresh, 0, 0, 0


CUPTI = StandInCupti()


@torch.library.custom_op("paratrace_test::gpu_like", mutates_args=())
def gpu_like(x: torch.Tensor) -> torch.Tensor:
    CUPTI.launch("gpu_like_kernel")
    return x.clone()


@gpu_like.register_fake
def _(x):
    return torch.empty_like(x)


gpu_like.register_autograd(lambda ctx, grad: grad)


def use_stand_in(monkeypatch) -> StandInCupti:
    global CUPTI
    CUPTI = StandInCupti()
    monkeypatch.setattr(session_module, "cuda_in_use", lambda: True)
    monkeypatch.setenv(device_direct.SOURCE_ENV, "cupti")
    monkeypatch.setattr(device_direct, "native",
                        lambda: ((CUPTI, 130001, "/stand-in/libcupti.so.13"), None))
    return CUPTI


def test_kernels_land_on_the_ops_that_launched_them(tmp_path, monkeypatch):
    cupti = use_stand_in(monkeypatch)
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with tracer.trace(str(tmp_path), steps="1-2"):
        for _ in range(4):
            x = gpu_like(gpu_like(model(torch.randn(4, 8))))
            x.sum().backward()
            opt.step()
            opt.zero_grad()
    # enabled for steps 1 and 2, at their first op; disabled when step 3 began; flushed at close
    assert (cupti.starts, cupti.stops, cupti.forced_flushes) == (1, 1, 1)
    assert cupti.launched == 4                     # two calls in each recorded step
    trace = tracer.load(rundir.trace_file(str(tmp_path), 0))
    meta = trace.meta["device_time"]
    assert meta["source"] == "cupti-direct" and meta["error"] is None
    assert meta["cupti_version"] == 130001 and meta["windows"] >= 1
    records, metas, problem = read_device(rundir.device_file(str(tmp_path), 0))
    assert problem is None and len(metas) == meta["windows"]
    assert [m["window"] for m in metas] == list(range(len(metas)))
    assert all(m["offset_ns"] == CUPTI_BEHIND_NS for m in metas)
    assert len(records) == 8 and int(records.is_launch.sum()) == 4
    # written in Unix ns: each launch after the recording's start in Unix time
    assert (records.start[records.is_launch] >= int(trace.meta["start_unix"] * 1e9)).all()
    dev = attribute(trace, records)
    summary = device_json(dev.summary(trace.dictionary("op"), trace.col("op")))
    assert summary["activities"] == summary["attributed"] == 4
    assert json.loads(json.dumps(summary)) == summary      # plain JSON, as summary.json's
    assert summary["attributed_by"]["inside_an_event"] == 4
    (op,) = [name for name in summary["by_op"] if "gpu_like" in name]
    # each kernel's 5 us, exact in the file's Unix ns; on the rank's clock (the clock pairs'
    # drift, which a loaded machine's pairs make, stretches them by parts per million) the
    # op weighs what its kernels last there
    assert ((records.end - records.start)[~records.is_launch] == KERNEL_NS).all()
    assert list(summary["by_op"]) == [op]
    assert summary["by_op"][op] == pytest.approx(float((dev.end - dev.start).sum()) / 1e9,
                                                 rel=1e-12)


def test_the_device_file_follows_the_process_groups_rank(tmp_path, monkeypatch):
    cupti = use_stand_in(monkeypatch)
    recorder = device_direct.DirectDeviceRecorder(str(tmp_path), 5, [], cupti, 130001, "x")
    assert recorder.start() and recorder.boundary(True) is False
    cupti.launch("before_the_group")
    recorder.write_pending()
    assert recorder.windows == 1
    recorder.follow_rank(0)
    cupti.launch("after_the_group")
    recorder.close()
    assert not (tmp_path / rundir.rank_file(5, "device.arrow")).exists()
    records, metas, problem = read_device(rundir.device_file(str(tmp_path), 0))
    assert problem is None and [m["window"] for m in metas] == [0, 1]
    assert sorted(records.names[i] for i in records.name[~records.is_launch]) == \
        ["after_the_group", "before_the_group"]
    assert recorder.meta()["windows"] == 2


def test_records_off_the_host_clock_are_kept_and_said(tmp_path, monkeypatch):
    cupti = use_stand_in(monkeypatch)
    recorder = device_direct.DirectDeviceRecorder(str(tmp_path), 0, [], cupti, 130001, "x")
    assert recorder.start()
    cupti.launch("on_time")
    real_clock = cupti.clock
    cupti.clock = lambda: (real_clock()[0] - 2 * 3600 * 10**9, real_clock()[1])   # 2 h off
    cupti.launch("late")
    recorder.close()
    records, _, problem = read_device(rundir.device_file(str(tmp_path), 0))
    assert problem is None and len(records) == 4               # kept, every one
    assert recorder.meta()["error"] == (
        "4 device records lie over an hour from the host clock: CUPTI's times are not Unix "
        "time here (a torch.profiler run earlier in this process may have set CUPTI's clock)")


def test_a_device_file_that_cannot_be_written_is_said_and_the_trace_goes_on(tmp_path,
                                                                          monkeypatch):
    cupti = use_stand_in(monkeypatch)
    gone = tmp_path / "gone"
    recorder = device_direct.DirectDeviceRecorder(str(gone), 0, [], cupti, 130001, "x")
    assert recorder.start()
    cupti.launch("nowhere")
    recorder.write_pending()                   # the flusher's call: no exception
    recorder.close()
    assert recorder.error.startswith("2 device records not written (") and recorder.errors == 1
    assert recorder.meta()["windows"] == 0


def test_a_running_profiler_keeps_cupti_off_until_it_stops(tmp_path, monkeypatch, capfd):
    cupti = use_stand_in(monkeypatch)
    recorder = device_direct.DirectDeviceRecorder(str(tmp_path), 0, [], cupti, 130001, "x")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        assert recorder.start() is False and recorder.start() is False
        assert recorder.boundary(True) is True and cupti.starts == 0
    assert recorder.start() is True and cupti.starts == 1      # the next step, after it
    recorder.close()
    assert recorder.error == device_notes.PROFILER_RUNNING and recorder.errors == 1
    assert capfd.readouterr().err.count("torch.profiler already holds CUPTI") == 1


def test_a_profiler_started_while_recording_finds_cupti_flushed_and_off_till_it_stops(
        tmp_path, monkeypatch, capfd):
    cupti = use_stand_in(monkeypatch)
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    with tracer.trace(str(tmp_path)):
        for step in range(6):
            if step == 2:
                profiler.start()      # the user's, between steps 1 and 2
            if step == 4:
                profiler.stop()
            gpu_like(model(torch.randn(4, 8))).sum().backward()
            opt.step()
            opt.zero_grad()
    # enabled at step 0; disabled and flushed as the profiler started (before it prepared:
    # CUPTI's buffers came back to this recorder), off while it ran; enabled again in the first
    # step begun after it stopped (a step ends at opt.step: zero_grad's first op, the profiler
    # still on, was the try of the step the profiler stopped in), so from iteration 5's
    # forward; disabled and flushed at the close
    assert (cupti.starts, cupti.stops, cupti.forced_flushes) == (2, 2, 2)
    assert cupti.launched == 3                      # iterations 0, 1 and 5
    meta = tracer.load(rundir.trace_file(str(tmp_path), 0)).meta["device_time"]
    assert meta["error"] == device_notes.PROFILER_STARTED and meta["errors"] == 1
    err = capfd.readouterr().err
    assert err.count(device_notes.PROFILER_STARTED) == 1
    assert "already holds CUPTI" not in err
    records, _, problem = read_device(rundir.device_file(str(tmp_path), 0))
    assert problem is None and int(records.is_launch.sum()) == 3


def test_a_profiler_not_seen_starting_is_left_cupti_at_the_next_boundary(tmp_path,
                                                                       monkeypatch):
    cupti = use_stand_in(monkeypatch)
    # made without a session, the recorder has no patch to tell it a profiler starts
    recorder = device_direct.DirectDeviceRecorder(str(tmp_path), 0, [], cupti, 130001, "x")
    assert recorder.start()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        assert recorder.boundary(True) is True       # seen here; not disabled under it
        assert cupti.stops == 0 and recorder.start() is False
    assert recorder.boundary(True) is True and recorder.start() is True
    recorder.close()
    assert (cupti.starts, cupti.stops) == (2, 1)
    assert recorder.error == device_notes.PROFILER_STARTED


@pytest.mark.gpu
def test_on_cuda_cupti_directly_records_what_kinetos_windows_did(tmp_path, monkeypatch):
    # the same steps recorded both ways on a GPU: the same kernels, memcpys and memsets by
    # name, each on the same op. Kineto's windows run first and leave CUPTI on Kineto's clock
    # (TSC ticks): the direct recording must set its own (on an H200 it did not, and its
    # kernels lay seconds off their launches)
    monkeypatch.setattr("tracer.recorder.device.kineto_windows.WINDOW_S", 0.0)
    steps = cuda_mlp_steps()
    got = {}
    for source, written in (("kineto", "cupti"), ("cupti", "cupti-direct")):
        monkeypatch.setenv(device_direct.SOURCE_ENV, source)
        out = str(tmp_path / source)
        with tracer.trace(out, steps="1-3"):
            steps(5)
        trace = tracer.load(rundir.trace_file(out, 0))
        assert trace.meta["device_time"]["source"] == written
        assert trace.meta["device_time"]["error"] is None
        assert trace.meta["device_time"].get("clock", "unix") == "unix"
        records, _, problem = read_device(rundir.device_file(out, 0))
        assert problem is None
        dev = attribute(trace, records)
        assert dev is not None and (dev.row >= 0).all(), (source, "a kernel was unattributed")
        ops, op_of = trace.dictionary("op"), trace.col("op")[dev.row]
        got[source] = Counter((KINDS[k], dev.names[n], ops[o])
                              for k, n, o in zip(dev.kind, dev.name, op_of))
    assert got["cupti"] == got["kineto"]


@pytest.mark.gpu
@pytest.mark.parametrize("source, written", [("kineto", "cupti"), ("cupti", "cupti-direct")])
def test_on_cuda_a_users_profiler_keeps_its_kernels_and_device_time_resumes_after_it(
        tmp_path, monkeypatch, source, written):
    # 2 steps, the user's torch.profiler (CPU and CUDA) over 2 steps, 3 steps after it: the
    # user's export holds its steps' kernels, and the recorder's device file kernels of steps
    # before and after it, each attributed (written without a GPU: first run by a GPU session)
    monkeypatch.setattr("tracer.recorder.device.kineto_windows.WINDOW_S", 0.0)
    monkeypatch.setenv(device_direct.SOURCE_ENV, source)
    steps = cuda_mlp_steps()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    profile = torch.profiler.profile(activities=activities)
    out = str(tmp_path / "run")
    with tracer.trace(out):
        steps(2)
        profile.start()
        steps(2)
        profile.stop()
        steps(3)
    export = tmp_path / "users.json"
    profile.export_chrome_trace(str(export))
    events = json.loads(export.read_text())["traceEvents"]
    assert sum(e.get("cat") == "kernel" for e in events) > 0      # the user's, whole
    trace = tracer.load(rundir.trace_file(out, 0))
    meta = trace.meta["device_time"]
    assert meta["source"] == written
    assert meta["error"] == device_notes.PROFILER_STARTED and meta["errors"] == 1
    records, _, problem = read_device(rundir.device_file(out, 0))
    assert problem is None
    dev = attribute(trace, records)
    assert dev is not None and (dev.row >= 0).all()
    # kernels on ops of the steps before the profiler and of those after it
    kernel_steps = set(trace.col("step")[dev.row[dev.kind == KINDS.index("kernel")]].tolist())
    assert min(kernel_steps) <= 1 and max(kernel_steps) >= 5, kernel_steps
