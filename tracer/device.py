"""GPU activity while recording: CUPTI's kernels, memcpys, memsets and their launches, through
torch's own Kineto binding (torch.profiler with the CUDA activity only).

Measured on an H100 (shared/fixtures/gpu-h100): CUPTI activity tracing adds nothing measurable
to a traced run, while a CUDA event pair around every op triples the step time. So the
recorder asks CUPTI, not the CUDA runtime, when each op's work ran.

The profiler runs while the session records. At step boundaries (at most every
``window_s`` seconds) and when recording stops, the window's records are saved with Kineto's
own Chrome-trace export; the next window starts at the first op outside any record_function
range (see :meth:`DeviceRecorder.boundary`); the flusher thread parses the export
(:mod:`tracer.kineto`) and appends it to ``rank-<R>.device.arrow`` (:mod:`tracer.device_format`),
so a crash loses at most the window under way. Stopping a window waits for the GPU (the
profiler synchronizes), once per window. When torch.profiler is already running in the
process (the user profiles), the recorder says so once and keeps to host time.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from typing import Optional

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


class DeviceRecorder:
    """CUPTI records of one rank, a window at a time (see the module docstring)."""

    activity = "CUDA"      # the ProfilerActivity recorded (tests without a GPU use CPU)

    def __init__(self, traces_dir: str, rank: int, pairs: list,
                 window_s: Optional[float] = None):
        self.traces_dir = traces_dir
        self.rank = rank
        self.window_s = WINDOW_S if window_s is None else window_s
        self.pairs = pairs              # the session's clock pairs: each window edge adds one
        self.error: Optional[str] = None
        self._refused = False           # the user's torch.profiler holds CUPTI: host time only
        self._profiler = None
        self._started = 0.0
        self._windows = 0
        self._pending: list = []        # saved exports not yet written
        self._lock = threading.Lock()
        self._writer: Optional[DeviceWriter] = None

    def start(self) -> bool:
        """Start a window; False (said once on stderr) if the user's profiler holds CUPTI."""
        import torch
        from torch.profiler import ProfilerActivity, profile
        if torch.autograd._profiler_enabled():
            self._refused = True
            if self.error is None:
                self.error = "torch.profiler is already running in this process"
                print(f"paratrace: rank {self.rank}: torch.profiler already holds CUPTI; "
                      "recording host time only (trace-report --kineto merges your profile)",
                      file=sys.stderr, flush=True)
            return False
        self._profiler = profile(activities=[getattr(ProfilerActivity, self.activity)])
        self._profiler.start()
        self._started = time.monotonic()
        self._pair()
        return True

    def due(self) -> bool:
        return self._profiler is not None and time.monotonic() - self._started >= self.window_s

    def boundary(self, recording: bool) -> bool:
        """A step boundary: end the window under way when recording stops or when it is
        ``window_s`` old. Returns whether a window should start: the caller starts it
        (:meth:`start`) where no record_function range is open.

        NOTE: a profiler started inside a record_function range that ends while it runs
        crashes the process when the range's objects are collected (torch 2.13, CPU activity;
        reproduced without paratrace). Optimizer steps run their step hooks inside such a
        range, so a window never starts at the boundary itself; stopping one there is safe."""
        if self._profiler is not None and (not recording or self.due()):
            self.cut()
        return recording and self._profiler is None and not self._refused

    @property
    def windows(self) -> int:
        """Windows ended so far."""
        return self._windows

    def meta(self) -> dict:
        """The trace metadata's ``device_time`` object."""
        return {"source": "cupti", "windows": self._windows, "error": self.error}

    def cut(self) -> None:
        """End the window under way (it syncs the GPU) and save its export for the flusher."""
        if self._profiler is None:
            return
        profiler, self._profiler = self._profiler, None
        profiler.stop()
        self._pair()
        window, self._windows = self._windows, self._windows + 1
        path = os.path.join(self.traces_dir,
                            f".{rundir.rank_file(self.rank, f'window-{window}.json')}")
        profiler.export_chrome_trace(path)
        with self._lock:
            self._pending.append((window, path))

    def write_pending(self) -> None:
        """Parse the saved windows and append them to the device file (the flusher's job)."""
        with self._lock:
            pending, self._pending = self._pending, []
        for window, path in pending:
            try:
                records = load_chrome_trace(path)
            except KinetoError as exc:
                self.error = self.error or f"a device window was unreadable ({exc})"
                continue
            finally:
                if os.path.exists(path):
                    os.remove(path)
            if self._writer is None:
                self._writer = DeviceWriter(rundir.device_file(self.traces_dir, self.rank),
                                            {"rank": self.rank, "source": "cupti"})
            self._writer.write(records, {"window": window,
                                         "devices": records.meta.get("devices")})

    def close(self) -> None:
        try:
            self.cut()
            self.write_pending()
        except Exception as exc:   # never lose the host trace over the GPU's
            self.error = self.error or f"{type(exc).__name__}: {exc}"
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
