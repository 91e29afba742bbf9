"""The recording session: owns everything recorded for one process and streams it to disk.

The private dispatch mode (``hotpath/_mode.py``) hands each op to :meth:`Session.on_op`, the hot path.
The session keeps the lifecycle (start, the process group's arrival, close) and the step
windows; the rest lives in focused modules: communication (comm.py), every patch into torch and
os (patches/), annotations, stacks, module paths (modules.py), phases, shapes, the status file
(tracer.files.status), clock alignment, the flusher and GPU activity (device*.py).
"""
from __future__ import annotations

import importlib
import os
import sys
import threading
import time
from typing import Optional

import torch
import torch.distributed as dist

from tracer.files import rundir, status
from tracer.files.dictionaries import Dictionaries
from tracer.vocab import ops
from tracer.vocab.labels import (PHASE_BACKWARD, PHASE_FORWARD, PHASE_GRAD_SYNC, PHASE_OPTIMIZER,
                                 PHASE_OTHER, PHASE_RECOMPUTE)
from tracer.vocab.library import META_KEY as LIBRARY_META

from . import _active, patches, rows
from .frameworks import compiled, hops
from .process import exits, process_group
from .memory import memory_recorder as memory
from .hotpath._mode import RecordingMode, op_entry
from .hotpath._native import native_hot_path
from .attribution.annotations import AnnotationStack, Range
from .process.clock import ClockAlignment
from .comm import CommTracker, special_op
from .device.kineto_windows import DeviceRecorder, clock_pair, cuda_in_use, pairs_meta
from .device.cupti_direct import DirectDeviceRecorder, device_recorder
from .frameworks.dtensor import SubclassOps, function_phase
from .flusher import Flusher
from .attribution.modules import ModuleTracker
from .options import TraceOptions
from .passthrough import recorder_failed
from .phases import PhaseRules
from .process.process_info import rank_and_world, start_meta
from .attribution.shapes import ShapeSignatures
from .attribution.stacks import StackInterner

_now = time.perf_counter_ns
_current_node = torch._C._current_autograd_node
_grad_enabled = torch.is_grad_enabled
_graph_task = getattr(torch._C, "_current_graph_task_id", lambda: -1)
_get_ident = threading.get_ident
_getframe = sys._getframe
_pack = rows.RECORD.pack
_sequence_nr = torch.autograd._get_sequence_nr     # in every torch of the range

MAX_QUEUE = 200_000          # events held in memory before the hot path flushes itself
MAX_NODES = 1 << 18          # forward autograd nodes remembered (this and the last window)
# on_op's common path in C (csrc/hotpath/onop.c): the fields it reads are its base's members
_HOT = native_hot_path()
_SessionState = getattr(_HOT, "SessionState", object)
C_ON_OP = _SessionState is not object     # built, and not PARATRACE_PURE_PYTHON


class Session(_SessionState):
    """Records this process into ``out_dir/rank-<R>.arrow``. Use through :func:`tracer.trace`."""
    _memory = None       # memory.MemoryRecorder while memory is recorded (options.memory)

    def __init__(self, out_dir: str, options: Optional[TraceOptions] = None, **option_values):
        self.out_dir = os.path.abspath(out_dir)
        self.options = options if options is not None else TraceOptions(**option_values)
        opts = self.options
        # step -> recorded or not (--steps); exits.py swaps it in a forked child
        self._window = opts.in_window() or (lambda step: True)
        self._record_shapes = bool(opts.record_shapes)
        self._record_stacks = bool(opts.record_stacks)
        self._stacks = StackInterner(opts.stack_depth, opts.library_frames, opts.user_paths,
                                     opts.library)
        self._dicts = Dictionaries(self._stacks)
        self._op_ids = self._dicts.op
        self._signatures = ShapeSignatures(self._dicts.shapes)
        self._shapes = self._signatures.id_of
        self._annotations = AnnotationStack(self._dicts.annotation)
        self._flusher = Flusher(self._dicts, lambda: self._op_ids(ops.OP_STEP),
                                opts.flush_interval, self._after_flush, self._flusher_failed)
        self._modules = ModuleTracker(self._dicts.module, self._flusher.merge_meta)
        self._queue = self._flusher.queue
        self._push = self._queue.append
        self._capture = self._stacks.capture
        self._comm = self._flusher.comm = CommTracker(self._dicts, self._push)
        self._clock = ClockAlignment(opts.clock_sync, opts.clock_timeout)
        # id(op overload) -> (op id, CommSpec, special, call, the overload). NOTE: by id: an
        # OpOverload hashes in Python; torch keeps overloads alive, and so does the entry.
        self._specs: dict = {}
        self._funcol, self._futures = self._comm.funcol, self._comm.futures   # read every op
        self._threads: dict = {}           # thread ident -> small thread number
        # forward autograd node sequence number -> its origin, (stack + 1) << 32 | (module + 1)
        # (an int: ints are not objects the garbage collector tracks), this step and the last
        self._fwd_of_node, self._fwd_prev = {}, {}
        self._last_seq = _sequence_nr()    # nodes made before the trace are not its ops'
        self.step_index, self._explicit_steps, self._in_optimizer = 0, False, 0
        self._recompute = 0                # checkpointing recomputations running (phases.py)
        self._torch_state = (_current_node, _grad_enabled, _graph_task, _sequence_nr)   # C's
        self._rules = PhaseRules(self, self._modules, self._annotations)
        self._recording, self._paused = self._window(0), 0
        self._passthrough = not self._recording   # the hot path records nothing
        self._annotations.set_live(self._recording)
        self._owner = threading.get_ident()       # the thread whose dispatch stack holds the mode
        self.config: dict = {}             # everything record_config set
        self.rank, self.world_size = rank_and_world()      # until a process group says
        self._pg_seen, self._open = False, False
        self._mode: Optional[RecordingMode] = None
        self._device: Optional[DeviceRecorder | DirectDeviceRecorder] = None   # CUDA only
        self._device_wanted, self._open_ranges = False, 0  # a window waits for no open range
        self._pairs = [clock_pair()]       # clock pairs; the device adds its window edges
        self._patches: Optional[patches.Patches] = None    # every patch into torch and os
        self._last_event_ns, self.status, self.error = 0, "running", None
        self._recorder_error: Optional[str] = None   # the recorder failed: passthrough.py

    # ------------------------------------------------------------------ lifecycle
    @property
    def path(self) -> str:
        return rundir.trace_file(self.out_dir, self.rank)

    @property
    def status_path(self) -> str:
        return rundir.status_file(self.out_dir, self.rank)

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
        in_c = C_ON_OP and isinstance(self._stacks, _HOT.StackWalk) and \
            isinstance(self._signatures, _HOT.ShapeKeys)     # the C on_op (else Python twins)
        self._memory = memory.recording(self, in_c)   # hooks before the patches' optimizer's
        self._flusher.open(self.path, meta)
        self._open = True
        _active.ACTIVE = self
        if self.options.record_modules:
            self._modules.install()
        compiled.prepare(self, self._modules, self.options.compiled != "eager")
        self._patches = patches.install(self)
        RecordingMode.skip_dynamo()
        self._mode = RecordingMode(self.on_op, compiled=self.options.compiled != "eager")
        self._mode._on_subclass = SubclassOps(self, self._mode)     # DTensor (dtensor.py)
        self._hops = hops.HigherOrderOps(self, self._mode)          # torch.cond... (hops.py)
        if in_c:
            self._mode.dispatch_in_c(_HOT.OpDispatch, self)
        self._mode.__enter__()
        self._owner = threading.get_ident()
        if not self._recording:
            self._leave_window()
        if self.options.device_time and cuda_in_use():
            self._device = device_recorder(self.out_dir, self.rank, self._pairs)
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
        if not self._open:
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
        self._open = False

    # ------------------------------------------------------------------ hot path
    def on_op(self, func, args, kwargs):
        """Run one dispatched op and queue its row (OP_ROW, then COMM_ROW for collectives).

        The hot path: every aten op of a recorded step comes through here, so it reads cached
        specs, packs one record and leaves everything else to the flusher. Outside recorded
        steps the mode is off the dispatch stack and nothing here runs. Where the C extension
        is built, csrc/hotpath/onop.c does the same for plain ops, step for step, without
        this frame (the mode's __torch_dispatch__ is C, hotpath/_mode.py); this method is its twin, and
        takes the rest: collectives, special ops, an op's first call, tensor subclasses.
        A failure of the recorder's own work puts the rank into passthrough (passthrough.py):
        the op runs, or has run, and returns its result.
        """
        entry = self._specs.get(id(func))
        if entry is None:
            try:
                entry = op_entry(self._specs, self._op_ids, func)
            except Exception as exc:
                recorder_failed(self, exc)
                return func(*args, **kwargs)
        if self._passthrough:
            return entry[3](*args, **kwargs)
        op_id, comm, special, call, _ = entry
        try:
            if self._device_wanted and not self._open_ranges:
                self._start_device()
            if special is None and comm is not None and not self._pg_seen:
                process_group.arrived(self)
            if special is None and (self._funcol or self._futures):
                self._comm.before_op(args)
        except Exception as exc:
            recorder_failed(self, exc)
            return call(*args, **kwargs)
        if special is not None:
            return special_op(self, special, func, args, kwargs, op_id)
        t0 = _now()
        out = call(*args, **kwargs)
        t1 = _now()
        try:   # NOTE: one frame on purpose: a method call more would cost on every op
            node = _current_node()
            hint = self._annotations.phase_hint
            # the frame that dispatched the op (on_op <- __torch_dispatch__ <- it); None where
            # the dispatch is the outermost frame (CUDA backward ops: autograd's device threads)
            try:
                frame = _getframe(2)
            except ValueError:
                frame = None
            if node is None or self._recompute:
                module = self._modules.current
                stack = -1 if not self._record_stacks else \
                    self._capture(frame) if frame is not None else self._stacks.empty()
                fwd_stack = -1
                seq = _sequence_nr()
                made = seq != self._last_seq  # autograd recorded the op (or nodes came before it)
                if made:                  # autograd nodes were created: remember their origin
                    # NOTE: nodes made since the last recorded op go to this op (after a
                    # Function that runs no aten op: the next one); grad off: in a Function's
                    # forward (phases.py)
                    fwd = stack if _grad_enabled() else self._rules.applied_at(frame, stack)
                    origin = (fwd + 1) << 32 | (module + 1)
                    if 1 < seq - self._last_seq <= 8:
                        for n in range(self._last_seq, seq):
                            self._fwd_of_node[n] = origin
                    else:                     # usually the one node this op made
                        self._fwd_of_node[seq - 1] = origin
                    self._last_seq = seq
                    if len(self._fwd_of_node) > MAX_NODES:   # a run that never steps stays bounded
                        self._fwd_prev, self._fwd_of_node = self._fwd_of_node, {}
                if node is not None:      # checkpointing replays it: recompute, unless annotated
                    phase = PHASE_RECOMPUTE if hint is None or hint <= PHASE_BACKWARD else hint
                elif hint is not None:
                    phase = hint
                elif self._in_optimizer:
                    phase = PHASE_OPTIMIZER
                elif module >= 0 or made:   # outside modules: what autograd records (the loss)
                    phase = PHASE_FORWARD
                elif _graph_task() >= 0:    # the autograd engine's final callbacks: DDP's finalize
                    phase = PHASE_GRAD_SYNC
                else:
                    phase = PHASE_OTHER
            else:   # annotations naming a phase past backward (grad_sync...) win
                phase = hint if hint is not None and hint > PHASE_BACKWARD else PHASE_BACKWARD
                nseq = node._sequence_nr()
                if self._memory is not None:    # what the node saved for it: activations
                    self._memory.table.node_runs(node, nseq)
                origin = self._fwd_of_node.get(nseq)
                if origin is None:
                    origin = self._fwd_prev.get(nseq, 0)
                fwd_stack = (origin >> 32) - 1
                module = (origin & 0xFFFFFFFF) - 1
                stack = -1 if not self._record_stacks else \
                    self._capture(frame) if frame is not None else self._stacks.empty()
            thread = self._threads.get(_get_ident())
            if thread is None:
                thread = self._thread()
            shapes = self._shapes(args) if self._record_shapes else -1
            cid = -1     # a collective's end (t1: -1 for now) comes with its completion (comm.py)
            if comm is not None:
                if hint is None:
                    phase = self._rules.collective(phase, node, module, args, comm)
                    if phase == PHASE_OTHER and node is None:     # in an autograd Function?
                        phase = function_phase(frame, phase)
                    elif module < 0 and node is not None and phase == PHASE_GRAD_SYNC:
                        module = self._rules.owner_module(node)     # DDP's bucket all-reduce
                cid = self._comm.launch(comm, args, out, t0, t1, phase, self.step_index, thread)
            self._push(_pack(t0, t1 if cid < 0 else -1, op_id, phase, module, stack, fwd_stack,
                             self._annotations.current, self.step_index, thread, shapes, cid))
            self._last_event_ns = t1
            if self._memory is not None:     # the storages it made (memory_recorder.py)
                self._memory.table.outputs(func, out, t0, thread, comm is not None)
            if len(self._queue) > MAX_QUEUE:
                self._flusher.flush()
        except Exception as exc:
            recorder_failed(self, exc)
        return out

    def _recorder_failed(self, exc: BaseException) -> None:
        recorder_failed(self, exc)      # the C on_op's way in (csrc/hotpath/onop.c)

    def _thread(self) -> int:
        ident = _get_ident()
        thread = self._threads.get(ident)
        if thread is None:
            thread = self._threads[ident] = len(self._threads)
            self._flusher.merge_meta("threads", {str(thread): ident})   # for CUPTI's thread ids
        return thread

    # ------------------------------------------------------------------ annotations & steps
    def annotate(self, label: str, attrs: dict) -> Range:
        return Range(self, label, attrs)

    def open_range(self, label: str, attrs: dict) -> tuple:
        return self._annotations.push(label, attrs)

    def close_range(self, entry: tuple, t0: int, module: int = -1, stack: int = -1) -> None:
        """Record the range (with itself in its annotation; the module and stack that opened
        it, where known) and close it."""
        if self._recording and not self._paused:
            hint = self._annotations.phase_hint
            self._push(rows.record(
                t0=t0, t1=_now(), op=self._op_ids(ops.OP_ANNOTATION),
                phase=hint if hint is not None else PHASE_OTHER, module=module, stack=stack,
                annotation=self._annotations.current, step=self.step_index,
                thread=self._thread()))
        self._annotations.pop(entry)

    def step(self) -> None:
        self._explicit_steps = True
        self._advance_step()

    def _advance_step(self) -> None:
        self.step_index += 1
        self._fwd_prev, self._fwd_of_node = self._fwd_of_node, {}
        recording = self._window(self.step_index)
        if recording != self._recording:
            self._recording = recording
            self._passthrough = not recording or self._paused > 0
            self._annotations.set_live(recording)
            if self._memory is not None:     # its module hooks: on in recorded steps only
                self._memory.follow_window(recording)
            if recording:
                self._enter_window()
            else:
                self._leave_window()
        if recording:
            t = _now()
            self._push(rows.record(t0=t, t1=t, op=self._op_ids(ops.OP_STEP), phase=PHASE_OTHER,
                                   step=self.step_index, thread=self._thread()))
        if self._device is not None:
            self._device_step()
        self._flusher.wake()     # the finished step goes to disk now, not at the next interval

    def _device_step(self) -> None:
        self._device_wanted = self._device.boundary(self._recording)
        self._flusher.add_meta(pairs_meta(self._pairs))

    def _start_device(self) -> None:
        self._device_wanted = False
        if self._device.start():
            self._flusher.add_meta(pairs_meta(self._pairs))

    def _leave_window(self) -> None:
        """Outside recorded steps the dispatch mode and the module hooks are off: those steps
        run as they would untraced. Possible only on the thread that entered the mode and
        with the mode on top of its stack; otherwise it stays on and records nothing."""
        if _get_ident() != self._owner or not self._mode.suspend():
            return
        self._stacks.release()
        if self.options.record_modules and self._modules.idle:
            self._modules.remove()

    def _enter_window(self) -> None:
        # NOTE: a window opening on another thread than the trace's cannot put the mode back on
        # that thread's stack; steps advance on it in practice (optimizer steps, tracer.step())
        if _get_ident() != self._owner or not self._mode.suspended:
            return
        self._mode.resume()
        self._open_ranges = 0    # ranges that ended unseen while suspended must not block windows
        if self.options.record_modules and not self._modules.installed:
            self._modules.install()

    def _optimizer_post(self, optimizer, args, kwargs) -> None:
        self._in_optimizer = max(0, self._in_optimizer - 1)
        # the end of the outermost optimizer step is a step boundary
        if self._in_optimizer == 0 and self.options.auto_step and not self._explicit_steps:
            self._advance_step()

    def record_config(self, values: dict) -> None:
        self.config.update(values)
        self._flusher.merge_meta("config", values)

    # ------------------------------------------------------------------ status
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
