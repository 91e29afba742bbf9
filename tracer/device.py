"""GPU activity while recording: CUPTI's kernels, memcpys, memsets and their launches, through
torch's own Kineto binding (the profiler with the CUDA activity only).

Measured on an H100 (shared/fixtures/gpu-h100): CUPTI activity tracing adds nothing measurable
to a traced run, while a CUDA event pair around every op triples the step time. So the
recorder asks CUPTI, not the CUDA runtime, when each op's work ran.

The profiler runs while the session records, a window at a time. At step boundaries (at most
every ``window_s`` seconds) and when recording stops, the training thread ends the window with
only what must run on the thread that enabled the profiler (its state is thread-local): it
waits for the GPU (the window's last kernels must be in it) and disables the profiler
(``torch.autograd._disable_profiler``: Kineto collects and sorts CUPTI's records). The result
goes to the flusher thread, which saves it with Kineto's own Chrome-trace export
(``_ProfilerResult.save``), parses the export (:mod:`tracer.kineto`) and appends it to
``rank-<R>.device.arrow`` (:mod:`tracer.device_format`); closing the session saves what the
flusher has not. The next window starts at the first op outside any record_function range (see
:meth:`DeviceRecorder.boundary`). A killed process loses the window under way and the windows
the flusher had not written yet (it writes after every flush, at most ``flush_interval`` apart).
When torch.profiler is already running in the process (the user profiles), the recorder says
so once and keeps to host time.

Where this torch lacks a part of that binding, torch.profiler.profile runs the windows instead,
its export still on the flusher. ``DeviceRecorder.window_path = "torch.profiler"`` restores the
path before: torch.profiler stopped and exported at the cut, on the training thread
(benchmarks/device_windows.py measures the two side by side).

NOTE: ``_ProfilerResult.save`` holds the GIL while it writes (torch 2.6, 2.11, 2.13 and 2.14.1,
as does ``_disable_profiler`` up to 2.13; measured in docs/overhead.md): the flusher's save
still delays the training thread wherever that thread wants to run Python meanwhile, and is
free only while it waits outside the GIL (for the GPU, a collective, the data loader). What is
certain is that the export no longer runs on the training thread.
"""
from __future__ import annotations

import functools
import os
import sys
import threading
import time
import uuid
from typing import Callable, Optional

from . import rundir
from .device_format import DeviceWriter
from .kineto import KinetoError, load_chrome_trace

WINDOW_S = 1.0


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


class DeviceRecorder:
    """CUPTI records of one rank, a window at a time (see the module docstring)."""

    activity = "CUDA"      # the ProfilerActivity recorded (tests without a GPU use CPU)
    # "binding": torch.autograd's binding, the export saved and parsed by the flusher;
    # "torch.profiler": the path before, stopped and exported at the cut on the training thread
    window_path = "binding"

    def __init__(self, traces_dir: str, rank: int, pairs: list,
                 window_s: Optional[float] = None):
        self.traces_dir = traces_dir
        self.rank = rank
        self.window_s = WINDOW_S if window_s is None else window_s
        self.pairs = pairs              # the session's clock pairs: each window edge adds one
        self.error: Optional[str] = None
        self._refused = False           # the user's torch.profiler holds CUPTI: host time only
        self._window = None             # the window under way
        self._started = 0.0
        self._windows = 0
        self._pending: list = []        # (window, save or None when saved, export path)
        self._lock = threading.Lock()          # the pending list: held for a swap only
        self._write_lock = threading.Lock()    # one writer at a time, windows in order
        self._writer: Optional[DeviceWriter] = None

    def start(self) -> bool:
        """Start a window; False (said once on stderr) if the user's profiler holds CUPTI."""
        import torch
        if torch.autograd._profiler_enabled():
            self._refused = True
            if self.error is None:
                self.error = "torch.profiler is already running in this process"
                print(f"paratrace: rank {self.rank}: torch.profiler already holds CUPTI; "
                      "recording host time only (trace-report --kineto merges your profile)",
                      file=sys.stderr, flush=True)
            return False
        window = self._new_window()
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
        return recording and self._window is None and not self._refused

    @property
    def windows(self) -> int:
        """Windows ended so far."""
        return self._windows

    def meta(self) -> dict:
        """The trace metadata's ``device_time`` object."""
        return {"source": "cupti", "windows": self._windows, "error": self.error}

    def cut(self) -> None:
        """End the window under way (on CUDA it waits for the GPU) and hand it to the
        flusher."""
        if self._window is None:
            return
        window, self._window = self._window, None
        save = window.stop()
        self._pair()
        index, self._windows = self._windows, self._windows + 1
        path = os.path.join(self.traces_dir,
                            f".{rundir.rank_file(self.rank, f'window-{index}.json')}")
        if self.window_path == "torch.profiler":
            self._export(save, path)    # the path before: the export on the training thread
            save = None
        with self._lock:
            self._pending.append((index, save, path))

    def write_pending(self) -> None:
        """Save, parse and append the ended windows to the device file (the flusher's job;
        at close, the closing thread's)."""
        with self._write_lock:
            with self._lock:
                pending, self._pending = self._pending, []
            for index, save, path in pending:
                try:
                    if save is not None:
                        self._export(save, path)
                    records = load_chrome_trace(path)
                except (OSError, RuntimeError) as exc:    # torch's save, not the parse
                    self.error = self.error or f"a device window was not saved ({exc})"
                    continue
                except KinetoError as exc:
                    self.error = self.error or f"a device window was unreadable ({exc})"
                    continue
                finally:
                    if os.path.exists(path):
                        os.remove(path)
                if self._writer is None:
                    self._writer = DeviceWriter(rundir.device_file(self.traces_dir, self.rank),
                                                {"rank": self.rank, "source": "cupti"})
                self._writer.write(records, {"window": index,
                                             "devices": records.meta.get("devices")})

    def _export(self, save: Callable[[str], None], path: str) -> None:
        """Kineto's Chrome-trace export of an ended window, written to ``path``."""
        save(path)

    def close(self) -> None:
        try:
            self.cut()
            self.write_pending()
        except Exception as exc:   # never lose the host trace over the GPU's
            self.error = self.error or f"{type(exc).__name__}: {exc}"
        with self._write_lock:
            if self._writer is not None:
                self._writer.close()
                self._writer = None

    def _pair(self) -> None:
        self.pairs.append(clock_pair())


MAX_PAIRS = 64


def pairs_meta(pairs: list) -> dict:
    """The trace metadata's ``clock_pairs``: the first pair and the latest ones (at most
    MAX_PAIRS, so a long run's metadata stays small;
    viz.analysis.gpu_attribution.to_local interpolates between the first and the last)."""
    kept = pairs if len(pairs) <= MAX_PAIRS else pairs[:1] + pairs[-(MAX_PAIRS - 1):]
    return {"clock_pairs": list(kept)}


def clock_pair() -> dict:
    """perf_counter and time.time read together: maps CUPTI's Unix times onto the trace's
    clock (viz.analysis.gpu_attribution.to_local)."""
    return {"perf_ns": time.perf_counter_ns(), "unix_ns": time.time_ns()}
