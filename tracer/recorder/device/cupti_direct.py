"""GPU activity straight from CUPTI's activity API, with no Kineto window to close.

Kineto's windows (:mod:`tracer.recorder.device.kineto_windows`) stall the training thread each time
one closes: the profiler's stop and the export must both run on it (measured on an H200, 329.8 ms
median for a step in which a window closed, against 141.0 ms; docs/overhead.md). Here CUPTI stays
enabled while the session records. It fills buffers and hands each back on a thread of its own every
``FLUSH_PERIOD_MS`` (``cuptiActivityFlushPeriod``); the C completion callback (csrc/cupti/cupti.c)
turns the records into device-file rows there, without the GIL, and the flusher thread drains them
into ``rank-<R>.device.arrow`` (:mod:`tracer.files.device_format`), a batch per drain. The training
thread only enables CUPTI, disables it when recording pauses, and at the session's close waits for
the GPU once and flushes what is left.

The libcupti used is the one torch's CUDA build loaded (found in the process's mappings), so
Kineto and this module share it: a user's torch.profiler that records CUDA registers buffer
callbacks of its own and disables the kinds when it stops. So, as on the Kineto path
(:mod:`tracer.recorder.device.device_notes`), CUPTI is disabled and flushed into this recorder's
rows before a user's profiler prepares, stays off while it runs, and is enabled again at the first
recorded step after it stopped; said once. A profiler the patch misses (one that prepares without
``torch.autograd.profiler``) is seen at the next step boundary, and CUPTI is then left to it.

CUPTI's clock is set to CLOCK_REALTIME at each start (``cuptiActivityRegisterTimestampCallback``),
so its records are Unix ns, as the format says. Kineto sets a clock of its own at each
profiler start (the TSC's ticks, which its export converts), and keeps it after: on an H200
(torch 2.11) a torch.profiler run earlier in the process left the kernels of a direct
recording seconds off their launches, until this recorder set its own. Where CUPTI cannot take
a clock (before CUDA 11.6), each drain pairs CUPTI's clock with CLOCK_REALTIME
(``_cupti.clock``); records that then land over an hour from the host's clock are kept and
said (``device_time.error``).

The default since its first GPU runs (an H200, torch 2.11.0+cu130; docs/gpu.md): every
activity attributed, device time within 0.3% of a torch.profiler export's, and no step stalled
by a window's close. ``PARATRACE_DEVICE_SOURCE=kineto`` asks for Kineto's windows instead.
Without the extension or without a libcupti in the process, Kineto's windows record (said once
where ``cupti`` was asked for by name); so they do where the process's libcupti is one whose
record layouts were not tested (``_cupti.TESTED_VERSIONS``), does not load, or the GIL is off
(free-threaded Python: the C module's rows are not shared safely without it), said once. Where
CUPTI refuses to start, the recorder keeps to host time, said once. Buffers CUPTI hands back that
the C module did not hand out (another profiler's, which slipped past the patch) are left to
their owner, unread, counted and said once.
"""
from __future__ import annotations

import functools
import os
import threading
import time
from typing import Optional

import numpy as np
import pyarrow as pa

from tracer.files import rundir
from tracer.files.device_format import DeviceRecords, DeviceWriter, warm_up

from ..hotpath._native import gil_enabled
from .kineto_windows import DeviceRecorder, clock_pair
from .device_notes import DeviceNotes

SOURCE_ENV = "PARATRACE_DEVICE_SOURCE"      # "cupti" (default) or "kineto"
SOURCES = ("kineto", "cupti")
FLUSH_PERIOD_MS = 500       # CUPTI's own thread hands the buffers back this often
BUFFER_BYTES = 4 << 20
OFF_CLOCK_NS = 3600 * 10**9   # a drained record further than this from now: a clock gone wrong
FOREIGN = ("CUPTI handed back buffers another profiler allocated (one that started without "
           "torch.profiler's Python API: dynolog...): left to it, unread")
ROW = np.dtype([(f, "<i8") for f in ("kind", "name", "start", "end", "device", "stream",
                                     "corr", "tid", "nbytes")])


def source() -> str:
    """The device-time source asked for: ``PARATRACE_DEVICE_SOURCE``, default ``cupti``.
    Raises ValueError naming the variable for any other value."""
    wanted = os.environ.get(SOURCE_ENV, "cupti").strip().lower() or "cupti"
    if wanted not in SOURCES:
        raise ValueError(f"{SOURCE_ENV}={wanted!r}: expected one of {', '.join(SOURCES)}")
    return wanted


def libcupti_path(maps: str = "/proc/self/maps") -> Optional[str]:
    """The libcupti this process has loaded (torch's CUDA build links it), or None."""
    try:
        with open(maps) as f:
            for line in f:
                path = line.rstrip("\n").split(maxsplit=5)[-1]
                if os.path.basename(path).startswith("libcupti.so"):
                    return path
    except OSError:
        return None
    return None


@functools.lru_cache(maxsize=1)
def native() -> tuple:
    """((the _cupti module, cuptiGetVersion, libcupti's path), None) or (None, why not)."""
    import torch  # noqa: F401  (its CUDA build loads libcupti: imported before looking)
    if not gil_enabled():       # before the import, which would turn the GIL back on
        return None, "the GIL is disabled (free-threaded Python)"
    try:
        from .. import _cupti
    except ImportError:
        return None, "the _cupti extension is not built"
    path = libcupti_path()
    if path is None:
        return None, "torch loaded no libcupti"
    try:
        version = _cupti.load(path)
    except (OSError, RuntimeError) as exc:
        return None, f"libcupti did not load ({exc})"
    if version not in _cupti.TESTED_VERSIONS:
        return None, (f"{path} is CUPTI {version}, whose record layouts are not tested (tested: "
                      f"{', '.join(map(str, _cupti.TESTED_VERSIONS))})")
    return (_cupti, version, path), None


def device_recorder(traces_dir: str, rank: int, pairs: list):
    """The session's device recorder: CUPTI directly (the default) where possible, else
    Kineto's windows. Where the variable asked for CUPTI by name, or a libcupti is in the
    process but not driven (an untested version...), why not is said once on stderr and in the
    metadata's error; otherwise (no extension, no libcupti) the default falls back quietly (the
    metadata's ``source`` says which recorded)."""
    wanted = source()
    if wanted == "cupti":
        found, why = native()
        if found is not None:
            return DirectDeviceRecorder(traces_dir, rank, pairs, *found)
        recorder = DeviceRecorder(traces_dir, rank, pairs)
        by_name = bool(os.environ.get(SOURCE_ENV, "").strip())
        if by_name or libcupti_path() is not None:
            recorder.say_once(f"{f'{SOURCE_ENV}=cupti: ' if by_name else ''}{why}; "
                              "device time comes from Kineto's windows")
        return recorder
    return DeviceRecorder(traces_dir, rank, pairs)


_NAMES: dict = {}            # module -> every name it has drained in this process, in order
_NAMES_LOCK = threading.Lock()


def drain(module) -> tuple:
    """(the rows made since the last drain, as bytes; every name the module has drained in
    this process, which the rows index; rows lost; records dropped; buffers left to another
    profiler). The C module's names are the process's, not a session's: a later session's rows
    index names an earlier one drained. A drain that fails (no memory) takes nothing: the C
    module keeps its rows, and the names are asked for from the count held here."""
    with _NAMES_LOCK:
        # the names are the drain's owner's (the C module, also behind a wrapper)
        names = _NAMES.setdefault(getattr(module.drain, "__self__", module), [])
        data, fresh, lost, dropped, foreign = module.drain(len(names))
        names.extend(fresh)
        return data, names, lost, dropped, foreign


def records_of(data: bytes, names: list, offset_ns: int) -> DeviceRecords:
    """Drained rows (``ROW`` each) as DeviceRecords in Unix ns, with only the names they use.
    ``names`` holds every name drained so far (the rows index it)."""
    rows = np.frombuffer(data, dtype=ROW)
    used, code = np.unique(rows["name"], return_inverse=True)
    return DeviceRecords(kind=rows["kind"].copy(), name=code.astype(np.int64),
                         start=rows["start"] + offset_ns, end=rows["end"] + offset_ns,
                         device=rows["device"].copy(), stream=rows["stream"].copy(),
                         corr=rows["corr"].copy(), tid=rows["tid"].copy(),
                         nbytes=rows["nbytes"].copy(), names=[names[i] for i in used.tolist()])


class DirectDeviceRecorder(DeviceNotes):
    """CUPTI records of one rank, drained by the flusher (see the module docstring). The
    session's calls are :class:`DeviceRecorder`'s."""

    def __init__(self, traces_dir: str, rank: int, pairs: list, module, version: int,
                 path: str):
        super().__init__(rank)
        self.traces_dir, self.pairs = traces_dir, pairs
        self._cupti, self.version, self.library = module, version, path
        self._on = False
        self._started = False           # CUPTI was started once: close flushes it
        self._refused = False
        self._batches = 0
        self._offset_ns = 0             # Unix ns - CUPTI ns, at the latest drain
        self._lost = self._dropped = self._foreign = 0
        self._writer: Optional[DeviceWriter] = None
        self._lock = threading.Lock()   # the drain and the file
        # the flusher's first batch would pay pyarrow's first-use costs holding the GIL, in a
        # step; here, at the session's start, outside any (the worst drain on an H200 took
        # 29.9 ms against 0.0 ms median; on the CPU a first batch 12.5 ms, the next 0.9 ms)
        warm_up()

    def follow_rank(self, rank: int) -> None:
        """The process group's rank: the device file, if made already, follows it."""
        with self._lock:
            if rank != self.rank and self._writer is not None:
                path = rundir.device_file(self.traces_dir, rank)
                os.replace(self._writer.path, path)
                self._writer.path = path
            self.rank = rank

    @property
    def windows(self) -> int:
        """Batches written so far (a batch per drain that had rows)."""
        return self._batches

    def start(self) -> bool:
        if self._refused or self.profiler_running(recorded_before=self._started):
            return False
        try:
            self._take_clock()
            self._cupti.start(BUFFER_BYTES, FLUSH_PERIOD_MS)
        except RuntimeError as exc:
            self._refused = True
            self.say_once(f"CUPTI did not start ({exc})",
                          f"CUPTI did not start ({exc}); recording host time only", topic="cupti")
            return False
        self._on = self._started = True
        self.pairs.append(clock_pair())
        return True

    def boundary(self, recording: bool) -> bool:
        """A step boundary: CUPTI is disabled while recording pauses. Returns whether it
        should start (the session starts it at its next op outside a range). A torch.profiler
        the patch missed holds CUPTI now: it is not disabled under it."""
        if self._on and self.profiler_running(recorded_before=True):
            self._on = False
        if self._on and not recording:
            self._disable()
        return recording and not self._on and not self._refused

    def meta(self) -> dict:
        """The trace metadata's ``device_time`` object."""
        return {"source": "cupti-direct", "windows": self._batches, "error": self.error,
                "errors": self.errors, "cupti_version": self.version,
                "rows_lost": self._lost, "records_dropped": self._dropped,
                "foreign_buffers": self._foreign,
                "clock": "unix" if self._cupti.own_clock() else "paired"}

    def _take_clock(self) -> None:
        cupti_ns, unix_ns = self._cupti.clock()
        self._offset_ns = unix_ns - cupti_ns

    def write_pending(self) -> None:
        """Drain the rows CUPTI's thread made and append them as a batch (the flusher's job;
        at close, the closing thread's)."""
        with self._lock:
            try:
                data, names, lost, dropped, foreign = drain(self._cupti)
            except MemoryError:       # the C module kept its rows: the next drain takes them
                self._note("a drain of CUPTI's rows ran out of memory (retried at the next)")
                return
            self._take_clock()
            if foreign:
                self._foreign += foreign
                self.say_once(FOREIGN, topic="foreign")
            if lost or dropped:
                self._lost += lost
                self._dropped += dropped
                self._note(f"{lost:,} device rows lost (memory) and {dropped:,} records "
                           "dropped by CUPTI (its buffers were full)")
            if not data:
                return
            records = records_of(data, names, self._offset_ns)
            off = int((np.abs(records.start - time.time_ns()) > OFF_CLOCK_NS).sum())
            if off:
                self._note(f"{off:,} device record{'s lie' if off != 1 else ' lies'} over an "
                           "hour from the host clock: "
                           "CUPTI's times are not Unix time here (a torch.profiler run "
                           "earlier in this process may have set CUPTI's clock)")
            try:
                if self._writer is None:
                    self._writer = DeviceWriter(
                        rundir.device_file(self.traces_dir, self.rank),
                        {"rank": self.rank, "source": "cupti-direct"})
                self._writer.write(records, {"window": self._batches,
                                             "offset_ns": self._offset_ns})
                self._batches += 1
            except (OSError, pa.ArrowException) as exc:   # the host trace goes on
                self._note(f"{len(records):,} device records not written ({exc})")

    def yield_to_profiler(self) -> bool:
        """A user's torch.profiler is starting: CUPTI's records so far are flushed into this
        recorder's rows and its kinds disabled, before the profiler registers its own."""
        if not self._on:
            return False
        self._disable()
        self._cupti.flush(True)
        return True

    def _disable(self) -> None:
        """The kinds disabled once the GPU has run what was launched (the recorded steps' last
        kernels, as a Kineto window's cut waits for them)."""
        self._sync()
        self._cupti.stop()
        self._on = False
        self.pairs.append(clock_pair())

    def close(self) -> None:
        """Wait for the GPU, disable CUPTI, flush its buffers and write what they held."""
        self.closing()
        for step in (self._stop_and_flush, self.write_pending):
            try:
                step()
            except Exception as exc:   # never lose the host trace over the GPU's
                self._note(f"{type(exc).__name__}: {exc}")
        with self._lock:
            if self._writer is not None:
                self._writer.close()
                self._writer = None

    @staticmethod
    def _sync() -> None:
        import torch
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    def _stop_and_flush(self) -> None:
        if self._on:
            self._sync()                      # the last kernels are complete, then flushed
            self._cupti.stop()
            self._on = False
        if self._started:
            self._cupti.flush(True)
