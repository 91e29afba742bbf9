"""GPU activity while recording: CUPTI's kernels, memcpys, memsets and their launches, through
torch's own Kineto binding (the profiler with the CUDA activity only).

Measured on an H100 (tests/assets/gpu-h100): CUPTI activity tracing adds nothing measurable
to a traced run, while a CUDA event pair around every op triples the step time. So the
recorder asks CUPTI, not the CUDA runtime, when each op's work ran.

The profiler runs while the session records, a window at a time. At step boundaries (at most
every ``window_s`` seconds) and when recording stops, the training thread ends the window: it
waits for the GPU (the window's last kernels must be in it), disables the profiler
(``torch.autograd._disable_profiler``: Kineto collects and sorts CUPTI's records; the state is
thread-local) and saves Kineto's own Chrome-trace export (``_ProfilerResult.save``), all before
the next window starts (see the NOTE). The flusher thread hands the file to the recording's
device worker (:mod:`tracer.recorder.device.window_worker`), a process started at the first window,
which parses it (:mod:`tracer.kineto.chrome_trace`) and appends it to ``rank-<R>.device.arrow``
(:mod:`tracer.files.device_format`). Closing the session waits for the worker
(``close_wait_s``; past it the exports not yet parsed stay on disk, named in the metadata).
Where the worker cannot start or dies, the flusher parses in this process, from the first
window it had not answered (said once). The next window starts at the first op outside any
record_function range (see :meth:`DeviceRecorder.boundary`). A killed process loses the window
under way and those not yet handed over; the worker appends the ones it was handed, then leaves.
While a user's torch.profiler runs, no window is open: one under way ends before the user's
profiler prepares, and windows start again at the first recorded step after it stopped (said
once; :mod:`tracer.recorder.device.device_notes` says why).

Where this torch lacks a part of that binding, torch.profiler.profile runs the windows instead.
``DeviceRecorder.window_path = "torch.profiler"`` forces that path;
``DeviceRecorder.parse_in = "flusher"`` parses in this process; ``DeviceRecorder.export_at =
"flusher"`` saves on the flusher (wrong on CUDA, kept to measure it: benchmarks/device_windows.py
runs the paths side by side).

NOTE: a window's result must be saved before the next window is enabled. Saved after it, every
CUPTI time of the window (kernels, memcpys, memsets, runtime calls) comes out as ``ts`` 0:
Kineto converts CUPTI's clock when it writes the export, with a converter that enabling the next
window replaces, and it clamps the times that fall before its base to 0. Measured on an H200
(torch 2.11.0+cu130, 2026-11-26; docs/gpu.md): four windows saved each after the next started
gave 305 of 305, 206 of 206, 206 of 206 and 0 of 206 events at ts 0 (the last was saved with no
window after it); saved at once, none. The CPU activity is not converted and shows nothing.
Saving at the cut costs the training thread the export (76-83 ms median at hidden 1024 on that
H200) on top of the stop (81-113 ms); docs/overhead.md, "Closing a device window".

NOTE: ``_ProfilerResult.save`` holds the GIL while it writes (torch 2.6, 2.11, 2.13 and 2.14.1,
as does ``_disable_profiler`` up to 2.13; docs/overhead.md). The parse no longer runs in this
process: on the CPU stand-in (2 vCPUs, torch 2.13.0; docs/overhead.md) a step in which a window
closed took 447 ms median, 782 worst with the worker against 544 and 989 with the flusher's
parse.
"""
from __future__ import annotations

import functools
import os
import subprocess
import threading
import time
import uuid
from typing import Callable, Optional

from tracer.files import rundir
from tracer.kineto.chrome_trace import load_chrome_trace

from .device_notes import DeviceNotes, profiler_enabled
from .window_worker import DeviceWorker, WindowAppender

WINDOW_S = 1.0
CLOSE_WAIT_S = 60.0      # how long closing waits for the worker's last windows


def cuda_in_use() -> bool:
    """Whether this process can record GPU activity: CUDA is there (whether the user's
    torch.profiler already holds CUPTI is checked when a window starts)."""
    try:
        import torch
    except ImportError:   # pragma: no cover - the recorder needs torch
        return False
    return torch.cuda.is_available()


@functools.lru_cache(maxsize=1)
def binding() -> Optional[dict]:
    """torch.autograd's profiler binding (what torch.profiler calls underneath), as a dict of
    its parts, or None where this torch lacks one of them."""
    try:
        import torch.autograd as autograd
        from torch._C._profiler import _ExperimentalConfig
        from torch.autograd import (ProfilerActivity, ProfilerConfig, ProfilerState,
                                    _disable_profiler, _enable_profiler, _prepare_profiler)
    except ImportError:
        return None
    result = getattr(autograd, "_ProfilerResult", None)
    if result is None or not hasattr(result, "save") or \
            not hasattr(autograd, "_supported_activities"):
        return None
    import torch.autograd.profiler as python_side   # its flag for dynamo and inductor
    return {"activity": ProfilerActivity, "config": ProfilerConfig, "state": ProfilerState,
            "experimental": _ExperimentalConfig, "prepare": _prepare_profiler,
            "enable": _enable_profiler, "disable": _disable_profiler,
            "supported": autograd._supported_activities,
            "on_start": getattr(python_side, "_run_on_profiler_start", lambda: None),
            "on_stop": getattr(python_side, "_run_on_profiler_stop", lambda: None)}


class BindingWindow:
    """A window through torch.autograd's binding: the calls torch.profiler.profile makes for
    one activity, without its Python wrapper (torch.autograd.profiler.profile's
    ``_prepare_trace``, ``_start_trace`` and ``__exit__``, the same from torch 2.6 to 2.14.1)."""

    def __init__(self, parts: dict, activity: str):
        self._parts = parts
        self._activities = {getattr(parts["activity"], activity)}
        self._sync = activity == "CUDA"
        self._config = parts["config"](parts["state"].KINETO, False, False, False, False,
                                       False, parts["experimental"](),
                                       f"{uuid.uuid4().int:032X}")   # as torch.profiler

    def start(self) -> None:
        self._parts["prepare"](self._config, self._activities)
        self._parts["on_start"]()
        self._parts["enable"](self._config, self._activities)

    def stop(self) -> Callable[[str], None]:
        """End the window on the thread that started it; returns what saves its export."""
        if self._sync:
            import torch
            torch.cuda.synchronize()      # as torch.profiler does: the last kernels are in
        result = self._parts["disable"]()
        self._parts["on_stop"]()
        return result.save


class ProfilerWindow:
    """A window through torch.profiler.profile (where the binding is missing, and the path
    before: ``DeviceRecorder.window_path = "torch.profiler"``)."""

    def __init__(self, activity: str):
        from torch.profiler import ProfilerActivity, profile
        self._profiler = profile(activities=[getattr(ProfilerActivity, activity)])

    def start(self) -> None:
        self._profiler.start()

    def stop(self) -> Callable[[str], None]:
        self._profiler.stop()
        return self._profiler.export_chrome_trace


class DeviceRecorder(DeviceNotes):
    """CUPTI records of one rank, a window at a time (see the module docstring)."""

    activity = "CUDA"      # the ProfilerActivity recorded (tests without a GPU use CPU)
    # "binding": torch.autograd's binding, the export saved and parsed by the flusher;
    # "torch.profiler": the path before, stopped and exported at the cut on the training thread
    window_path = "binding"
    # where the saved windows are parsed and appended: "worker", a process of the recording's
    # own (tracer.recorder.device.window_worker); "flusher": the flusher thread, in this process
    # (the path before, and the one taken when the worker cannot start or dies)
    parse_in = "worker"
    # where an ended window is saved (Kineto's export): "cut", on the training thread before
    # the next window starts; "flusher", later on the flusher thread: on CUDA every window
    # saved after the next one started comes out with all its times clamped to 0 (see NOTE)
    export_at = "cut"
    close_wait_s = CLOSE_WAIT_S

    def __init__(self, traces_dir: str, rank: int, pairs: list,
                 window_s: Optional[float] = None):
        super().__init__(rank)
        self.traces_dir = traces_dir
        self.window_s = WINDOW_S if window_s is None else window_s
        self.pairs = pairs              # the session's clock pairs: each window edge adds one
        self._window = None             # the window under way
        self._started = 0.0
        self._windows = 0
        self._pending: list = []        # (window, save or None when saved, export path)
        self._lock = threading.Lock()          # the pending list: held for a swap only
        self._write_lock = threading.Lock()    # one writer at a time, windows in order
        self._worker: Optional[DeviceWorker] = None       # parses and appends the windows
        self._in_process = False        # no worker (it died or did not start): parse here
        self._appender: Optional[WindowAppender] = None   # the in-process parse's

    def start(self) -> bool:
        """Start a window; False (said once on stderr) while a user's profiler holds CUPTI."""
        if self.profiler_running(recorded_before=self._windows > 0):
            return False
        window = self._new_window()
        with self.own_profiler_calls():
            window.start()
        self._window = window
        self._started = time.monotonic()
        self._pair()
        return True

    def _new_window(self):
        parts = binding() if self.window_path == "binding" else None
        if parts is not None and getattr(parts["activity"], self.activity) in \
                parts["supported"]():
            try:
                return BindingWindow(parts, self.activity)
            except TypeError:         # a ProfilerConfig of another shape: torch.profiler's
                pass
        return ProfilerWindow(self.activity)

    def due(self) -> bool:
        return self._window is not None and time.monotonic() - self._started >= self.window_s

    def boundary(self, recording: bool) -> bool:
        """A step boundary: end the window under way when recording stops or when it is
        ``window_s`` old. Returns whether a window should start: the caller starts it
        (:meth:`start`) where no record_function range is open.

        NOTE: a profiler started inside a record_function range that ends while it runs
        crashes the process when the range's objects are collected (torch 2.13, CPU activity;
        reproduced without paratrace). Optimizer steps run their step hooks inside such a
        range, so a window never starts at the boundary itself; stopping one there is safe."""
        if self._window is not None and (not recording or self.due()):
            self.cut()
        return recording and self._window is None

    def follow_rank(self, rank: int) -> None:
        """The process group's rank, taken while no window has been handed on."""
        if not self._windows:
            self.rank = rank

    @property
    def windows(self) -> int:
        """Windows ended so far."""
        return self._windows

    def meta(self) -> dict:
        """The trace metadata's ``device_time`` object."""
        return {"source": "cupti", "windows": self._windows, "error": self.error,
                "errors": self.errors}

    def cut(self) -> None:
        """End the window under way (on CUDA it waits for the GPU) and hand it to the
        flusher."""
        if self._window is None:
            return
        window, self._window = self._window, None
        try:
            # a profiler started and stopped since (where the patch is missing) ended the
            # session: stopping again crashes (torch 2.13, 2.14.1) or raises (2.10, 2.11)
            if not profiler_enabled():
                raise RuntimeError("another torch.profiler ended its session")
            with self.own_profiler_calls():
                save = window.stop()
        except RuntimeError as exc:
            self._pair()
            self._note(f"a device window was lost ({exc})")
            return
        self._pair()
        index, self._windows = self._windows, self._windows + 1
        path = os.path.join(self.traces_dir,
                            f".{rundir.rank_file(self.rank, f'window-{index}.json')}")
        if self.window_path == "torch.profiler" or self.export_at == "cut":
            saved = self._save(save, path)    # before the next window starts (see NOTE)
            if not saved:
                return
            save = None
        with self._lock:
            self._pending.append((index, save, path))

    def write_pending(self) -> None:
        """Save the ended windows and have them parsed and appended to the device file (the
        flusher's job; at close, the closing thread's)."""
        with self._write_lock:
            with self._lock:
                pending, self._pending = self._pending, []
            self._check_worker()
            for index, save, path in pending:
                if save is None or self._save(save, path):
                    self._parse(index, path)

    def _save(self, save: Callable[[str], None], path: str) -> bool:
        """Save a window's export; False (said in the metadata) where torch's save failed."""
        try:
            self._export(save, path)
            return True
        except (OSError, RuntimeError) as exc:
            self._note(f"a device window was not saved ({exc})")
            if os.path.exists(path):
                os.remove(path)
            return False

    def _export(self, save: Callable[[str], None], path: str) -> None:
        """Kineto's Chrome-trace export of an ended window, written to ``path``."""
        save(path)

    def _parse(self, index: int, path: str) -> None:
        """Window ``index``, saved at ``path``, to the worker; here if there is none."""
        if self.parse_in == "worker" and not self._in_process:
            if self._worker is None:
                try:
                    self._worker = DeviceWorker(self._device_path(), self.rank)
                except (OSError, ValueError, subprocess.SubprocessError) as exc:
                    self._in_process = True
                    self.say_once(f"the device worker did not start ({exc})")
            if self._worker is not None:
                if self._worker.send(index, path):
                    return
                self._fall_back()
        self._parse_here(index, path)

    def _parse_here(self, index: int, path: str) -> None:
        if self._appender is None:
            self._appender = WindowAppender(self._device_path(), self.rank)
        error = self._appender.append(index, path, load_chrome_trace)
        self._note(error)

    def _check_worker(self) -> None:
        """Take the worker's answers; fall back to this process if it died."""
        if self._worker is not None:
            self._worker.poll()
            self._take_errors(self._worker)
            if not self._worker.alive():
                self._fall_back()

    def _take_errors(self, worker: DeviceWorker) -> None:
        for _, error in worker.errors:
            self._note(error)
        worker.errors.clear()

    def _fall_back(self) -> None:
        """The worker died: go on with the device file it left (its complete windows), parse
        the windows it had not answered here, and every later one (said once)."""
        worker, self._worker = self._worker, None
        self._in_process = True
        worker.kill()
        self._take_errors(worker)
        self.say_once(f"the device worker stopped ({worker.exit_status()}) with "
                  f"{len(worker.sent)} window{'s' if len(worker.sent) != 1 else ''} "
                  "unanswered; the device windows are parsed in the training process")
        self._appender, done = WindowAppender.resume(self._device_path(), self.rank)
        for index, path in worker.sent.items():
            if index in done:                   # appended, killed before it answered
                if os.path.exists(path):
                    os.remove(path)
            elif os.path.exists(path):
                self._parse_here(index, path)
            else:
                self._note(f"device window {index} was lost with the worker")

    def _finish_worker(self) -> None:
        """At close: wait for the worker to answer every window (at most close_wait_s), then
        let it close the device file. Past the wait it is stopped and the windows it had not
        appended keep their exports on disk, named in the metadata."""
        worker = self._worker
        if worker is None:
            return
        if worker.wait(self.close_wait_s):
            self._worker = None
            worker.close()
        elif not worker.alive():
            self._fall_back()
        else:
            self._worker = None
            worker.kill()
            appender, done = WindowAppender.resume(self._device_path(), self.rank)
            appender.close()
            kept = []
            for index, path in worker.sent.items():
                if index not in done and os.path.exists(path):
                    kept.append(path)
                elif os.path.exists(path):
                    os.remove(path)
            if kept:
                self._note(
                    f"the device worker had not parsed {len(kept)} window"
                    f"{'s' if len(kept) != 1 else ''} after {self.close_wait_s:g} s: it was "
                    f"stopped and their exports kept ({', '.join(kept[:3])}"
                    f"{', ...' if len(kept) > 3 else ''})")
        self._take_errors(worker)

    def _device_path(self) -> str:
        return rundir.device_file(self.traces_dir, self.rank)

    def yield_to_profiler(self) -> bool:
        """A user's torch.profiler is starting: the window under way ends (and is saved) first."""
        if self._window is None:
            return False
        self.cut()
        return True

    def close(self) -> None:
        self.closing()
        try:
            self.cut()
            self.write_pending()
            with self._write_lock:
                self._finish_worker()
        except Exception as exc:   # never lose the host trace over the GPU's
            self._note(f"{type(exc).__name__}: {exc}")
        with self._write_lock:
            if self._worker is not None:          # only after an error above
                self._worker.kill()
                self._worker = None
            if self._appender is not None:
                self._appender.close()
                self._appender = None

    def _pair(self) -> None:
        self.pairs.append(clock_pair())


MAX_PAIRS = 64


def pairs_meta(pairs: list) -> dict:
    """The trace metadata's ``clock_pairs``: the first pair and the latest ones (at most
    MAX_PAIRS, so a long run's metadata stays small;
    viz.analysis.device.gpu_attribution.to_local interpolates between the first and the last)."""
    kept = pairs if len(pairs) <= MAX_PAIRS else pairs[:1] + pairs[-(MAX_PAIRS - 1):]
    return {"clock_pairs": list(kept)}


def clock_pair() -> dict:
    """perf_counter and time.time read together: maps CUPTI's Unix times onto the trace's
    clock (viz.analysis.device.gpu_attribution.to_local)."""
    return {"perf_ns": time.perf_counter_ns(), "unix_ns": time.time_ns()}
