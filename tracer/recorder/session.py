"""The recording session: owns everything recorded for one process and streams it to disk.

Session is the owner of the recording's parts and state; its bases are the hot path
(op_path.py: ``on_op``, whose C twin reads the session's fields, docs/recorder.md) and the step
windows (step_windows.py). The session keeps the lifecycle (start, the process group's arrival,
close) and what the status file reads; the rest lives in focused parts: communication (comm.py),
every patch into torch and os (patches/), annotations, stacks and module paths (attribution/),
phases, the status file (tracer.files.status), clock alignment (process/), the flusher, memory
(memory/) and GPU activity (device/).
"""
from __future__ import annotations

import importlib
import operator
import os
import threading
import time
from typing import Optional

import torch.distributed as dist

from tracer.files import rundir, status
from tracer.files.dictionaries import Dictionaries
from tracer.vocab import ops
from tracer.vocab.library import META_KEY as LIBRARY_META

from . import _active, patches
from .attribution.annotations import AnnotationStack
from .attribution.modules import ModuleTracker
from .attribution.shapes import ShapeSignatures
from .attribution.stacks import StackInterner
from .comm import CommTracker
from .device.cupti_direct import DirectDeviceRecorder, device_recorder
from .device.kineto_windows import DeviceRecorder, clock_pair, cuda_in_use, pairs_meta
from .flusher import Flusher
from .frameworks import compiled, hops
from .frameworks.dtensor import SubclassOps
from .hotpath._mode import RecordingMode
from .memory import memory_recorder as memory
from .op_path import C_ON_OP, MAX_NODES, MAX_QUEUE, NATIVE, TORCH_STATE, sequence_nr
from .options import TraceOptions
from .phases import PhaseRules
from .process import exits, process_group
from .process.clock import ClockAlignment
from .process.process_info import rank_and_world, start_meta
from .step_windows import StepWindows

_now = time.perf_counter_ns


def _part(field: str) -> property:
    """One of Session's parts, read only (its field stays Session's)."""
    return property(operator.attrgetter(field))


__all__ = ["Session", "C_ON_OP", "MAX_NODES", "MAX_QUEUE"]


class Session(StepWindows):
    """Records this process into ``traces_dir/rank-<R>.arrow``. Use through :func:`tracer.trace`."""
    _memory = None       # memory.MemoryRecorder while memory is recorded (options.memory)

    def __init__(self, traces_dir: str, options: Optional[TraceOptions] = None, **option_values):
        self.traces_dir = os.path.abspath(traces_dir)
        self.options = options if options is not None else TraceOptions(**option_values)
        opts = self.options
        # step -> recorded or not (--steps); exits.py swaps it in a forked child
        self.in_window = opts.in_window() or (lambda step: True)
        self._record_shapes = bool(opts.record_shapes)
        self._record_stacks = bool(opts.record_stacks)
        self._stacks = StackInterner(opts.stack_depth, opts.library_frames, opts.user_paths,
                                     opts.library)
        self._dicts = Dictionaries(self._stacks)
        self.op_ids = self._dicts.op
        self._signatures = ShapeSignatures(self._dicts.shapes)
        self._shapes = self._signatures.id_of
        self._annotations = AnnotationStack(self._dicts.annotation)
        self._flusher = Flusher(self._dicts, lambda: self.op_ids(ops.OP_STEP),
                                opts.flush_interval, self._after_flush, self._flusher_failed)
        self._modules = ModuleTracker(self._dicts.module, self._flusher.merge_meta)
        self._queue = self._flusher.queue
        self.push = self._queue.append
        self._capture = self._stacks.capture
        self._comm = self._flusher.comm = CommTracker(self._dicts, self.push)
        self._clock = ClockAlignment(opts.clock_sync, opts.clock_timeout)
        # id(op overload) -> (op id, CommSpec, special, call, the overload). NOTE: by id: an
        # OpOverload hashes in Python; torch keeps overloads alive, and so does the entry.
        self._specs: dict = {}
        self._funcol, self._futures = self._comm.funcol, self._comm.futures   # read every op
        self._threads: dict = {}           # thread ident -> small thread number
        # forward autograd node sequence number -> its origin, (stack + 1) << 32 | (module + 1)
        # (an int: ints are not objects the garbage collector tracks), this step and the last
        self.fwd_of_node, self.fwd_prev = {}, {}
        self._last_seq = sequence_nr()    # nodes made before the trace are not its ops'
        self.step_index, self._explicit_steps, self.in_optimizer = 0, False, 0
        self.recompute = 0                # checkpointing recomputations running (phases.py)
        self._torch_state = TORCH_STATE    # what the C on_op calls (op_path.py)
        self._rules = PhaseRules(self, self._modules, self._annotations)
        self.recording, self.paused = self.in_window(0), 0
        self.passthrough = not self.recording   # the hot path records nothing
        self._annotations.set_live(self.recording)
        self.owner = threading.get_ident()       # the thread whose dispatch stack holds the mode
        self.config: dict = {}             # everything record_config set
        self.rank, self.world_size = rank_and_world()      # until a process group says
        self.pg_seen, self.is_open = False, False
        self._mode: Optional[RecordingMode] = None
        self._device: Optional[DeviceRecorder | DirectDeviceRecorder] = None   # CUDA only
        self.device_wanted, self.open_ranges = False, 0  # a window waits for no open range
        self._pairs = [clock_pair()]       # clock pairs; the device adds its window edges
        self._patches: Optional[patches.Patches] = None    # every patch into torch and os
        self._last_event_ns, self.status, self.error = 0, "running", None
        self.recorder_error: Optional[str] = None   # the recorder failed: passthrough.py

    # ------------------------------------------------------------------ lifecycle
    @property
    def path(self) -> str:
        return rundir.trace_file(self.traces_dir, self.rank)

    @property
    def status_path(self) -> str:
        return rundir.status_file(self.traces_dir, self.rank)

    # the parts, read only, for the modules that use them (the status file among them)
    @property
    def flusher(self) -> Flusher:
        return self._flusher

    @property
    def comm(self) -> CommTracker:
        return self._comm

    @property
    def last_event_ns(self) -> int:
        return self._last_event_ns

    clock, modules, annotations = _part("_clock"), _part("_modules"), _part("_annotations")
    stacks, rules, hops = _part("_stacks"), _part("_rules"), _part("_hops")
    mode, device, memory = _part("_mode"), _part("_device"), _part("_memory")

    def __enter__(self) -> "Session":
        if _active.ACTIVE is not None:
            raise RuntimeError("a paratrace trace is already active in this process")
        rundir.open_new_trace(self.path)      # never over an earlier run's (EarlierTraces)
        meta = start_meta(self.rank, self.world_size, self.options.meta(), self._pairs,
                          self._stacks.HOT_PATH)
        meta[LIBRARY_META] = self._stacks.rule.meta()      # the report classifies frames so
        # NOTE: the first op dispatched through any Python mode imports torch._dynamo (seconds);
        # pay that before recording so it does not distort the first step's timeline.
        importlib.import_module("torch._dynamo")
        in_c = C_ON_OP and isinstance(self._stacks, NATIVE.StackWalk) and \
            isinstance(self._signatures, NATIVE.ShapeKeys)     # the C on_op (else Python twins)
        self._memory = memory.recording(self, in_c)   # hooks before the patches' optimizer's
        self._flusher.open(self.path, meta)
        self.is_open = True
        _active.ACTIVE = self
        if self.options.record_modules:
            self._modules.install()
        compiled.prepare(self, self._modules, self.options.compiled != "eager")
        self._patches = patches.install(self)
        RecordingMode.skip_dynamo()
        self._mode = RecordingMode(self.on_op, compiled=self.options.compiled != "eager")
        self._mode.on_subclass = SubclassOps(self, self._mode)     # DTensor (dtensor.py)
        self._hops = hops.HigherOrderOps(self, self._mode)          # torch.cond... (hops.py)
        if in_c:
            self._mode.dispatch_in_c(NATIVE.OpDispatch, self)
        self._mode.__enter__()
        self.owner = threading.get_ident()
        if not self.recording:
            self._leave_window()
        if self.options.device_time and cuda_in_use():
            self._device = device_recorder(self.traces_dir, self.rank, self._pairs)
            self._device_step()
        if dist.is_available() and dist.is_initialized():
            process_group.arrived(self)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._mode is not None:
            self._mode.resume()          # __exit__ pops the top of the stack: it must be there
            self._mode.__exit__(None, None, None)
            self._mode.dispatch_in_python()
            self._mode = None
        if exc_type is SystemExit:
            self._flusher.add_meta(exits.exit_meta("sys.exit", exc.code, self.step_index))
        if exc_type is None or (exc_type is SystemExit and exc.code in (0, None)):
            self.status = "ok"
            if dist.is_available() and dist.is_initialized():
                process_group.aligned_at_end(self)
        elif self.status != "running":   # said already by what ended the run (bootstrap)
            pass
        elif issubclass(exc_type, KeyboardInterrupt):
            self.status, self.error = "interrupted", "KeyboardInterrupt"
        else:
            self.status = "failed"
            self.error = f"{exc_type.__name__}: {exc}".strip()[:2000]
        self.close()
        _active.ACTIVE = None

    def close(self) -> None:
        """Stop recording, flush everything and write the final status. Idempotent."""
        if not self.is_open:
            return
        self._flusher.stop()
        if self._device is not None:
            self._device.close()           # its last window, written before the trace closes
        self._pairs.append(clock_pair())
        if self._patches is not None:
            self._patches.undo()
        self._modules.remove()             # its hooks, on in recorded windows
        self._flusher.add_meta({
            "status": self.status, "error": self.error, "end_ns": _now(),
            "end_unix": time.time(), "last_step": self.step_index,
            "last_collective": self._comm.last, "inflight": self._comm.inflight(),
            "failed_collectives": self._comm.failed, **pairs_meta(self._pairs),
            "device_time": self._device.meta() if self._device is not None else None})
        self._flusher.flush()
        if self._memory is not None:        # its last rows, before the writer closes
            self._memory.close(self._flusher, self._dicts.values())
        self._stacks.release()
        self._write_status(final=True)
        self._flusher.close()
        self.is_open = False

    # ------------------------------------------------------------------ config & status
    def record_config(self, values: dict) -> None:
        self.config.update(values)
        self._flusher.merge_meta("config", values)

    def _after_flush(self) -> None:
        if self._memory is not None:
            self._memory.write(self._flusher, self._dicts.values())
        self._write_status()
        if self._device is not None:
            self._device.write_pending()

    def _flusher_failed(self, exc: Exception) -> None:
        self.error = self.error or f"paratrace flusher: {exc}"

    def _write_status(self, final: bool = False) -> None:
        status.write_session_status(self, final)
