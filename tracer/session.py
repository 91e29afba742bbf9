"""The recording session: owns everything recorded for one process and streams it to disk.

The dispatch mode (``_mode.py``) only hands each op to :meth:`Session.on_op`; everything else
lives here: step windows, phase, module and stack context, annotations, communication
bookkeeping (process group ranks, bytes, completion times), the background flusher, the live
status file the watchdog reads, and clock alignment around the process group's life.
"""
from __future__ import annotations

import collections
import importlib
import json
import os
import socket
import sys
import threading
import time
import weakref
from typing import Optional

import torch
import torch.distributed as dist

from . import _active, clock, ops, rundir
from ._mode import RecordingMode
from .format import DICT_COLUMNS, FORMAT_VERSION, TraceWriter, rename
from .labels import PHASE_BACKWARD, PHASE_FORWARD, PHASE_OTHER, phase_of_attrs
from .options import parse_steps
from .modules import ModuleTracker
from .stacks import StackInterner

_now = time.perf_counter_ns
_current_node = torch._C._current_autograd_node
_grad_enabled = torch.is_grad_enabled
_get_ident = threading.get_ident
try:
    _sequence_nr = torch.autograd._get_sequence_nr
except AttributeError:  # pragma: no cover - very old torch: no backward attribution
    def _sequence_nr():
        return 0

# Row layout: indices into format.COLUMNS.
T1, KIND, CID = 1, 11, 18
MAX_QUEUE = 200_000          # events held in memory before the hot path flushes itself
MAX_NODES = 1 << 18          # forward autograd nodes remembered (this and the last window)

class Interner:
    """Strings -> small ids; ``values`` only grows (the writer relies on it for deltas)."""

    __slots__ = ("ids", "values")

    def __init__(self):
        self.ids: dict = {}
        self.values: list = []

    def __call__(self, text: str) -> int:
        i = self.ids.get(text)
        if i is None:
            i = self.ids[text] = len(self.values)
            self.values.append(text)
        return i


class Session:
    """Records this process into ``out_dir/rank-<R>.arrow``. Use through :func:`tracer.trace`."""

    def __init__(self, out_dir: str, *, steps=None, stack_depth: int = 32,
                 library_frames: bool = False, record_shapes: bool = True,
                 record_stacks: bool = True, record_modules: bool = True,
                 flush_interval: float = 0.25, user_paths=(), clock_sync: bool = True,
                 clock_timeout: float = 20.0, auto_step: bool = True):
        self.out_dir = os.path.abspath(out_dir)
        self.options = dict(steps=None if steps is None else str(steps), stack_depth=stack_depth,
                            library_frames=library_frames, record_shapes=record_shapes,
                            record_stacks=record_stacks, record_modules=record_modules)
        self._in_window = parse_steps(steps)
        self._record_shapes = record_shapes
        self._record_stacks = record_stacks
        self._record_modules = record_modules
        self._flush_interval = flush_interval
        self._clock_sync = clock_sync
        self._clock_timeout = clock_timeout
        self._auto_step = auto_step
        # stack and fwd_stack share the StackInterner (its values go out for both columns)
        self._interners = {name: Interner() for name in DICT_COLUMNS
                           if name not in ("stack", "fwd_stack")}
        self._stacks = StackInterner(stack_depth, library_frames, user_paths)
        self._op_ids = self._interners["op"]
        self._modules = ModuleTracker(self._interners["module"])
        self._queue: collections.deque = collections.deque()
        self._specs: dict = {}
        self._threads: dict = {}
        self._shape_ids: dict = {}
        # forward autograd node sequence number -> (stack id, module id), this step and the last
        self._fwd_of_node: dict = {}
        self._fwd_prev: dict = {}
        self._last_seq = -1
        self.step_index = 0
        self._step_pending = False
        self._explicit_steps = False
        self._in_optimizer = 0
        self._recording = self._window(0)
        self._paused = 0
        self._annotations: list = []       # [(label, attrs, phase hint)]
        self._annotation_id = None
        self._phase_hint = None
        self._rf_open: list = []           # open record_function ranges: (entry, t0)
        # communication
        self._groups: dict = {}            # group key -> (group id, ranks)
        self._group_seq: dict = {}
        self._next_cid = 0
        self._pending: dict = {}           # cid -> row, collectives launched but not completed
        self._flushed_pending: set = set()
        self._funcol: dict = {}            # id(output) -> (weakref, row)
        self._last_comm: Optional[dict] = None
        self._comm_lock = threading.Lock()
        self._write_lock = threading.RLock()
        self._works: dict = {}             # id(Work) -> (Work, row) until waited or completed
        self._failed_comms: list = []      # collectives that ended in an error (described)
        # process and files
        self.rank, self.world_size = _rank_and_world()
        self._pg_seen = False
        self._clock_start_done = False
        self._clock_end_done = False
        self._meta_updates: dict = {}
        self._writer: Optional[TraceWriter] = None
        self._mode: Optional[RecordingMode] = None
        self._hooks: list = []
        self._patched: list = []
        self._stop = threading.Event()
        self._flusher: Optional[threading.Thread] = None
        self._last_event_ns = 0
        self.status = "running"
        self.error: Optional[str] = None

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
        os.makedirs(self.out_dir, exist_ok=True)
        meta = {
            "format_version": FORMAT_VERSION, "rank": self.rank, "world_size": self.world_size,
            "pid": os.getpid(), "host": socket.gethostname(), "start_ns": _now(),
            "start_unix": time.time(), "argv": list(sys.argv), "options": self.options,
            "torch": torch.__version__, "python": sys.version.split()[0],
            "local_rank": _env_int("LOCAL_RANK"), "node_rank": _env_int("GROUP_RANK"),
        }
        # NOTE: the first op dispatched through any Python mode imports torch._dynamo (seconds);
        # pay that before recording so it does not distort the first step's timeline.
        importlib.import_module("torch._dynamo")
        self._writer = TraceWriter(self.path, meta)
        self._flush_empty()
        _active.ACTIVE = self
        self._modules_install()
        self._patch_process_group()
        self._mode = RecordingMode(self.on_op)
        self._mode.__enter__()
        self._flusher = threading.Thread(target=self._flush_loop, name="paratrace-flusher",
                                         daemon=True)
        self._flusher.start()
        if dist.is_available() and dist.is_initialized():
            self._on_pg_init()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if self._mode is not None:
            self._mode.__exit__(None, None, None)
            self._mode = None
        if exc_type is None or (exc_type is SystemExit and exc.code in (0, None)):
            self.status = "ok"
            if dist.is_available() and dist.is_initialized():
                self._clock_end()
        elif issubclass(exc_type, KeyboardInterrupt):
            self.status, self.error = "interrupted", "KeyboardInterrupt"
        else:
            self.status = "failed"
            self.error = f"{exc_type.__name__}: {exc}".strip()[:2000]
        self.close()
        _active.ACTIVE = None

    def close(self) -> None:
        """Stop recording, flush everything and write the final status. Idempotent."""
        if self._writer is None:
            return
        self._stop.set()
        if self._flusher is not None and self._flusher is not threading.current_thread():
            self._flusher.join(timeout=10)
        for undo in self._hooks:
            undo()
        self._hooks.clear()
        self._unpatch_process_group()
        self._meta_updates.update({
            "status": self.status, "error": self.error, "end_ns": _now(),
            "end_unix": time.time(), "last_step": self.step_index,
            "last_collective": self._last_comm,
            "inflight": [self._describe(r) for r in list(self._pending.values())],
            "failed_collectives": self._failed_comms,
        })
        self._flush(final=True)
        self._stacks.release()
        self._write_status(final=True)
        self._writer.close()
        self._writer = None

    # ------------------------------------------------------------------ hot path
    def on_op(self, func, args, kwargs):
        if self._step_pending and not self._in_optimizer:
            self._advance_step()
        entry = self._specs.get(func)
        if entry is None:
            spec = ops.classify(func)
            entry = self._specs[func] = (self._op_ids(spec.name), spec.comm, spec.special)
        op_id, comm, special = entry
        if not self._recording or self._paused:
            return func(*args, **kwargs)
        if special is not None:
            return self._special_op(special, func, args, kwargs, op_id)
        if comm is not None and not self._pg_seen:
            self._on_pg_init()
        if self._funcol:
            self._await_async_args(args)
        t0 = _now()
        out = func(*args, **kwargs)
        t1 = _now()
        node = _current_node()
        fwd_stack = None
        if node is None:
            module = self._modules.current
            module = None if module < 0 else module
            stack = self._stacks.capture(sys._getframe(1)) if self._record_stacks else None
            seq = _sequence_nr()
            if seq != self._last_seq:     # autograd nodes were created: remember their origin
                # NOTE: nodes made since the last recorded op (a custom Function whose forward
                # runs no aten op, like Megatron's identity f) go to this op, the next one
                origin = (stack, module)
                first = self._last_seq if 0 < seq - self._last_seq <= 8 else seq - 1
                for created in range(first, seq):
                    self._fwd_of_node[created] = origin
                self._last_seq = seq
                if len(self._fwd_of_node) > MAX_NODES:   # a run that never steps stays bounded
                    self._fwd_prev, self._fwd_of_node = self._fwd_of_node, {}
            if self._in_optimizer:
                phase = PHASE_OTHER
            elif self._phase_hint is not None:
                phase = self._phase_hint
            elif module is not None or _grad_enabled():
                phase = PHASE_FORWARD
            else:
                phase = PHASE_OTHER
        else:
            phase = PHASE_BACKWARD
            nseq = node._sequence_nr()
            origin = self._fwd_of_node.get(nseq) or self._fwd_prev.get(nseq)
            if origin is not None:
                fwd_stack, module = origin
            else:
                module = None
            stack = self._stacks.capture(sys._getframe(1)) if self._record_stacks else None
        thread = self._thread()
        shapes = self._shapes(args) if self._record_shapes else None
        row = (t0, t1, op_id, phase, module, stack, fwd_stack, self._annotation_id,
               self.step_index, thread, shapes)
        if comm is not None:
            row = self._comm_row(comm, args, out, row)
        self._queue.append(row)
        self._last_event_ns = t1
        if len(self._queue) > MAX_QUEUE:
            self._flush()
        return out

    def _thread(self) -> int:
        ident = _get_ident()
        thread = self._threads.get(ident)
        if thread is None:
            thread = self._threads[ident] = len(self._threads)
        return thread

    def _shapes(self, args):
        key = []
        for a in args:
            if isinstance(a, torch.Tensor):
                key.append((a.dtype, a.shape))
            elif isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor):
                key.append(tuple((t.dtype, t.shape) for t in a if isinstance(t, torch.Tensor)))
        key = tuple(key)
        sid = self._shape_ids.get(key)
        if sid is None:
            sid = self._shape_ids[key] = self._interners["shapes"](_shape_text(key))
        return sid

    # ------------------------------------------------------------------ communication
    def _group(self, comm, args):
        arg = args[comm.group_arg] if comm.group_arg is not None and comm.group_arg < len(args) \
            else None
        key = arg if isinstance(arg, str) else getattr(arg, "_paratrace_key", None)
        if comm.api == "c10d" and arg is not None:
            pg = torch._C._distributed_c10d.ProcessGroup.unbox(arg) \
                if isinstance(arg, torch.ScriptObject) else arg
            key = pg.group_name
        else:
            pg = None
        cached = self._groups.get(key)
        if cached is None:
            ranks = ()
            try:
                if pg is None and isinstance(arg, str):
                    from torch.distributed.distributed_c10d import _resolve_process_group
                    pg = _resolve_process_group(arg)
                if pg is not None:
                    ranks = tuple(dist.get_process_group_ranks(pg))
            except Exception:
                ranks = ()
            gid = self._interners["group"](",".join(map(str, ranks)) if ranks else f"?{key}")
            cached = self._groups[key] = (gid, ranks)
        return cached

    def _comm_row(self, comm, args, out, base):
        gid, ranks = self._group(comm, args)
        peer = None
        if comm.peer_arg is not None and comm.peer_arg < len(args):
            local = args[comm.peer_arg]
            if isinstance(local, int):
                peer = ranks[local] if 0 <= local < len(ranks) else local
        nbytes, dtype = 0, None
        if comm.input_arg is not None and comm.input_arg < len(args):
            nbytes, dtype = _tensor_bytes(args[comm.input_arg])
        async_op = None
        if comm.async_arg is not None:
            # NOTE: the dispatcher drops trailing arguments left at their default (async_op
            # defaults to True in the c10d schemas), so a missing flag means the default
            async_op = bool(args[comm.async_arg]) if comm.async_arg < len(args) \
                else comm.async_default
        elif comm.api == "functional":
            async_op = True
        seq = self._group_seq.get(gid, 0)
        self._group_seq[gid] = seq + 1
        cid = self._next_cid
        self._next_cid += 1
        row = list(base)
        t_ret = row[T1]
        row[T1] = None
        row += [self._interners["kind"](comm.kind), gid, peer, nbytes,
                None if dtype is None else self._interners["dtype"](dtype), async_op, seq, cid,
                t_ret]
        self._pending[cid] = row
        self._last_comm = {"kind": comm.kind, "group": list(ranks), "seq": seq, "peer": peer,
                           "bytes": nbytes, "t0": row[0], "step": row[8]}
        if comm.api == "c10d":
            work = out[-1] if isinstance(out, (tuple, list)) else out
            self._track_work(work, row)
        else:
            try:
                self._funcol[id(out)] = (weakref.ref(out), row)
            except TypeError:
                self._complete(row, t_ret)
        return row

    def _track_work(self, work, row) -> None:
        """Completion of a c10d collective: its future's callback, else the end of its wait()."""
        try:
            if isinstance(work, torch.ScriptObject):
                work = torch._C._distributed_c10d.Work.unbox(work)
        except Exception:
            self._complete(row, row[-1])
            return
        # NOTE: gloo's send/recv works have no future, and waiting on them from a second thread
        # deadlocks; their completion is taken at the end of the caller's own wait() (patched).
        self._works[id(work)] = (work, row)
        try:
            fut = work.get_future()
        except Exception:
            return
        fut.add_done_callback(lambda f, row=row, key=id(work): self._future_done(f, row, key))

    def _future_done(self, fut, row, key) -> None:
        t = _now()
        self._works.pop(key, None)
        try:
            fut.value()
        except Exception as exc:   # e.g. a peer died: the collective never completed
            self._comm_failed(row, exc)
            return
        self._complete(row, t)

    def _comm_failed(self, row, exc) -> None:
        """A collective that ended in an error keeps no end time; the error goes to the meta."""
        with self._comm_lock:
            if self._pending.pop(row[CID], None) is None:
                return
            self._flushed_pending.discard(row[CID])
            failure = self._describe(row)
            first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            failure["error"] = f"{type(exc).__name__}: {first_line}"[:500]
            self._failed_comms.append(failure)

    def _work_waited(self, work) -> None:
        item = self._works.pop(id(work), None)
        if item is not None and item[0] is work:
            self._complete(item[1], _now())

    def _complete(self, row, t) -> None:
        with self._comm_lock:
            cid = row[CID]
            if self._pending.pop(cid, None) is None:
                return
            if cid in self._flushed_pending:
                self._flushed_pending.discard(cid)
                done = [t, t, self._op_ids(ops.OP_COMPLETE), row[3], None, None, None, None,
                        row[8], row[9], None] + [None] * 7 + [cid, None]
                self._queue.append(tuple(done))
            else:
                row[T1] = t

    def _await_async_args(self, args) -> None:
        """An op about to consume an AsyncCollectiveTensor waits for it first: time that wait."""
        for a in args:
            if type(a).__name__ != "AsyncCollectiveTensor":
                continue
            row = self._funcol_take(a)
            if row is not None:
                a.trigger_wait()
                self._complete(row, _now())

    def _funcol_take(self, tensor):
        """The pending functional collective whose output ``tensor`` is (or wraps), or None."""
        target = getattr(tensor, "elem", tensor) \
            if type(tensor).__name__ == "AsyncCollectiveTensor" else tensor
        item = self._funcol.get(id(target))
        if item is None or item[0]() is not target:
            return None
        del self._funcol[id(target)]
        return item[1]

    def _special_op(self, special, func, args, kwargs, op_id):
        if special == ops.WAIT:
            t0 = _now()
            out = func(*args, **kwargs)
            t1 = _now()
            pending = self._funcol_take(args[0] if args else kwargs.get("tensor"))
            cid = None
            if pending is not None:
                cid = pending[CID]
                self._complete(pending, t1)
            stack = self._stacks.capture(sys._getframe(1)) if self._record_stacks else None
            module = self._modules.current
            row = (t0, t1, op_id, PHASE_BACKWARD if _current_node() is not None else
                   (self._phase_hint if self._phase_hint is not None else PHASE_FORWARD),
                   None if module < 0 else module, stack, None, self._annotation_id,
                   self.step_index, self._thread(), None) + (None,) * 7 + (cid, None)
            self._queue.append(row)
            return out
        out = func(*args, **kwargs)
        if special == ops.RF_ENTER:
            name = args[0] if args else kwargs.get("name", "?")
            entry = self._push_annotation(str(name), {"source": "record_function"})
            self._rf_open.append((entry, _now()))
        elif special == ops.RF_EXIT and self._rf_open:
            # NOTE: the handle's Python wrapper differs between enter and exit, so ranges are
            # matched LIFO, as `with record_function(...)` nests them.
            self._pop_annotation(*self._rf_open.pop())
        return out

    # ------------------------------------------------------------------ annotations & steps
    def _push_annotation(self, label: str, attrs: dict):
        hint = phase_of_attrs(label, attrs)
        entry = (label, attrs, hint)
        self._annotations.append(entry)
        self._refresh_annotation()
        return entry

    def _pop_annotation(self, entry, t0: int) -> None:
        if self._recording and not self._paused:
            row = (t0, _now(), self._op_ids(ops.OP_ANNOTATION), self._phase_hint
                   if self._phase_hint is not None else PHASE_OTHER, None, None, None,
                   self._annotation_id, self.step_index, self._thread(), None)
            self._queue.append(row)
        for i in range(len(self._annotations) - 1, -1, -1):
            if self._annotations[i] is entry:
                del self._annotations[i]
                break
        self._refresh_annotation()

    def _refresh_annotation(self) -> None:
        if not self._annotations:
            self._annotation_id, self._phase_hint = None, None
            return
        payload = [dict({"label": label}, **attrs) for label, attrs, _ in self._annotations]
        self._annotation_id = self._interners["annotation"](
            json.dumps(payload, separators=(",", ":"), default=str))
        self._phase_hint = next((h for _, _, h in reversed(self._annotations) if h is not None),
                                None)

    def annotate(self, label: str, attrs: dict) -> "_Range":
        return _Range(self, label, attrs)

    def step(self) -> None:
        self._explicit_steps = True
        self._step_pending = False
        self._advance_step()

    def _advance_step(self) -> None:
        self._step_pending = False
        self.step_index += 1
        self._fwd_prev, self._fwd_of_node = self._fwd_of_node, {}
        self._recording = self._window(self.step_index)
        if self._recording:
            t = _now()
            self._queue.append((t, t, self._op_ids(ops.OP_STEP), PHASE_OTHER, None, None, None,
                                None, self.step_index, self._thread(), None))

    def _window(self, step: int) -> bool:
        return self._in_window is None or self._in_window(step)

    def _optimizer_pre(self, optimizer, args, kwargs) -> None:
        self._in_optimizer += 1

    def _optimizer_post(self, optimizer, args, kwargs) -> None:
        self._in_optimizer = max(0, self._in_optimizer - 1)
        if self._auto_step and not self._explicit_steps:
            self._step_pending = True   # applied at the next op outside an optimizer step

    def record_config(self, values: dict) -> None:
        config = dict(self._meta_updates.get("config") or {})
        config.update(values)
        self._meta_updates["config"] = config

    # ------------------------------------------------------------------ hooks & process group
    def _modules_install(self) -> None:
        from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                           register_optimizer_step_pre_hook)
        if self._record_modules:
            self._modules.install()
            self._hooks.append(self._modules.remove)
        for handle in (register_optimizer_step_pre_hook(self._optimizer_pre),
                       register_optimizer_step_post_hook(self._optimizer_post)):
            self._hooks.append(handle.remove)

    def _patch_process_group(self) -> None:
        if not dist.is_available():
            return
        import torch.distributed.distributed_c10d as c10d
        session = self
        original_init, original_destroy = c10d.init_process_group, c10d.destroy_process_group

        def init_process_group(*args, **kwargs):
            result = original_init(*args, **kwargs)
            session._on_pg_init()
            return result

        def destroy_process_group(group=None):
            if group is None or group is c10d.GroupMember.WORLD:
                session._on_pg_destroy()
            return original_destroy(group)

        work_type = torch._C._distributed_c10d.Work
        original_wait = work_type.wait

        def wait(work, *args, **kwargs):
            result = original_wait(work, *args, **kwargs)
            if session._works:
                session._work_waited(work)
            return result

        work_type.wait = wait
        self._patched.append((work_type, "wait", original_wait))
        for module in (c10d, dist):
            for name, new, old in (("init_process_group", init_process_group, original_init),
                                   ("destroy_process_group", destroy_process_group,
                                    original_destroy)):
                if getattr(module, name, None) is old:
                    setattr(module, name, new)
                    self._patched.append((module, name, old))

    def _unpatch_process_group(self) -> None:
        for module, name, old in self._patched:
            setattr(module, name, old)
        self._patched.clear()

    def _on_pg_init(self) -> None:
        if self._pg_seen or not (dist.is_available() and dist.is_initialized()):
            return
        self._pg_seen = True
        rank, world = dist.get_rank(), dist.get_world_size()
        with self._write_lock:
            if rank != self.rank and self._writer is not None:
                old_status = self.status_path
                self.rank = rank
                rename(self._writer, self.path)
                if os.path.exists(old_status):
                    os.remove(old_status)
            self.rank, self.world_size = rank, world
        self._meta_updates.update({"rank": rank, "world_size": world,
                                   "backend": str(dist.get_backend())})
        if self._clock_sync and not self._clock_start_done:
            self._clock_start_done = True
            estimate = self._paused_call(clock.estimate_offset, self._clock_timeout)
            self._meta_updates["clock_start"] = estimate.to_json() if estimate else None

    def _on_pg_destroy(self) -> None:
        if self._writer is not None and dist.is_initialized():
            self._clock_end()

    def _clock_end(self) -> None:
        if self._clock_sync and not self._clock_end_done and self._clock_start_done:
            self._clock_end_done = True
            estimate = self._paused_call(clock.estimate_offset, self._clock_timeout)
            self._meta_updates["clock_end"] = estimate.to_json() if estimate else None

    def _paused_call(self, fn, *args):
        self._paused += 1
        try:
            return fn(*args)
        finally:
            self._paused -= 1

    # ------------------------------------------------------------------ flushing & status
    def _flush_loop(self) -> None:
        while not self._stop.wait(self._flush_interval):
            try:
                self._flush()
                self._write_status()
            except Exception as exc:  # never let the flusher kill the run; report at close
                self.error = self.error or f"paratrace flusher: {exc}"

    def _flush(self, final: bool = False) -> None:
        with self._write_lock:
            if self._writer is None:
                return
            queue = self._queue
            rows = [queue.popleft() for _ in range(len(queue))]
            with self._comm_lock:
                for i, row in enumerate(rows):
                    if type(row) is list:
                        if row[T1] is None:
                            self._flushed_pending.add(row[CID])
                        rows[i] = tuple(row)
            meta, self._meta_updates = self._meta_updates, {}
            if not rows and not meta:
                return
            self._writer.write(rows, self._dictionaries(), meta or None)

    def _flush_empty(self) -> None:
        # an empty first batch makes the file valid at once: a rank killed before its first
        # flush leaves a readable trace with no events rather than an empty file
        self._writer.write([], self._dictionaries(), None)

    def _dictionaries(self) -> dict:
        dictionaries = {name: interner.values for name, interner in self._interners.items()}
        dictionaries["stack"] = dictionaries["fwd_stack"] = self._stacks.values
        return dictionaries

    def _describe(self, row) -> dict:
        kinds = self._interners["kind"].values
        groups = self._interners["group"].values
        return {"kind": kinds[row[KIND]], "group": groups[row[KIND + 1]], "seq": row[17],
                "peer": row[13], "bytes": row[14], "t0": row[0], "step": row[8]}

    def _write_status(self, final: bool = False) -> None:
        status = {
            "rank": self.rank, "pid": os.getpid(), "now_ns": _now(), "status": self.status,
            "step": self.step_index, "last_event_ns": self._last_event_ns,
            "events": self._writer.events if self._writer else None,
            "last_collective": self._last_comm,
            "inflight": [self._describe(r) for r in list(self._pending.values())],
            "failed_collectives": list(self._failed_comms), "error": self.error,
            "trace": self.path, "final": final,
        }
        tmp = self.status_path + ".tmp"
        try:
            with open(tmp, "w") as fh:
                json.dump(status, fh)
            os.replace(tmp, self.status_path)
        except OSError:
            pass


class _Range:
    """One annotation range; a context manager and a decorator."""

    __slots__ = ("session", "label", "attrs", "entry", "t0")

    def __init__(self, session, label, attrs):
        self.session, self.label, self.attrs = session, label, attrs

    def __enter__(self):
        self.t0 = _now()
        self.entry = self.session._push_annotation(self.label, self.attrs)
        return self

    def __exit__(self, *exc):
        self.session._pop_annotation(self.entry, self.t0)
        return False


def _rank_and_world():
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return _env_int("RANK") or 0, _env_int("WORLD_SIZE") or 1


def _env_int(name: str) -> Optional[int]:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def _tensor_bytes(value):
    """Total bytes and dtype name of a tensor or (nested) list of tensors."""
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size(), ops.dtype_name(value.dtype)
    total, dtype = 0, None
    if isinstance(value, (list, tuple)):
        for item in value:
            nbytes, dt = _tensor_bytes(item)
            total += nbytes
            dtype = dtype or dt
    return total, dtype


def _shape_text(key) -> str:
    def one(item):
        dtype, shape = item
        return f"{ops.dtype_name(dtype)}[{','.join(map(str, shape))}]"
    parts = []
    for item in key:
        if item and isinstance(item[0], tuple):
            parts.append("[" + ",".join(one(t) for t in item) + "]")
        elif item:
            parts.append(one(item))
        else:
            parts.append("[]")
    return " ".join(parts)
