"""Memory recording (``tracer.trace(memory=True)``): every storage this process's ops make, its
bytes, when it was freed and what it is kept for, written as memory rows of the trace
(docs/trace-format.md, "Memory"; the mechanism measured in docs/overhead.md, "Memory tracking").

The mechanism: the hot path hands each op's outputs to :meth:`MemoryRecorder.outputs` (the
Python ``on_op``), or looks them up itself (the C one, csrc/onop.c, for plain ops: the same
table, :meth:`MemoryRecorder.first_sight` on a miss). Each output's storage is keyed by its
StorageImpl's address (``_cdata``, read with compat.storage_key: unique while alive; zero-byte
storages, whose data pointer is 0, do not collide). On first sight it records an allocation
(``t0`` and thread of the op, so the reader links it to the op's row; bytes = the storage's
``nbytes()``) and keeps a weak reference with a callback in the table (the table's entry is
that reference: :class:`_Entry`); torch keeps a storage's
Python object alive as long as its C++ storage lives, so the callback records the real free.
Storages made before the recording (parameters, optimizer state) are found by walks: a module's
parameters, buffers and gradients when the module is first called, an optimizer's parameters
and gradients before each step and its state after it; one not seen before is an allocation
with no op (thread null).

Categories (format.MEMORY_CATEGORIES, in this order): a storage starts as ``comm`` when a
collective made it, else ``temporaries``; it moves only later in the list, never back, each
move a ``reclass`` row:

- ``comm``: a temporary a collective writes into in place (DDP's gradient buckets, made by
  ``aten.empty`` and all-reduced each step; FSDP2's all-gather and reduce-scatter buffers);

- ``activations``: a temporary or comm storage autograd saves for backward (a pack hook of
  ``torch.autograd.graph.saved_tensors_hooks`` that only looks the storage up; a region under
  hooks of its own, such as torch.utils.checkpoint's, saves nothing here);
- ``optimizer_state``: a tensor in an optimizer's ``state`` after its step;
- ``gradients``: a parameter's ``.grad`` (or ``.main_grad``), before each optimizer step and
  when its module is first seen;
- ``parameters``: a module's parameters and buffers, an optimizer's parameters, and a
  module's own parameters after each of its calls (those a wrapper swapped in for the call:
  FSDP2's unsharded parameters).

The reader and viz/analysis/memory/live_bytes.py take a storage's last category for its whole life
(it was made to be that: a gradient is first an op's output in backward). Not seen: storages only
ops' inputs carry (a batch made before the recording), allocations freed inside one op, and
storages of steps outside ``steps`` (their frees still count); the CPU allocator's rounding.
"""
from __future__ import annotations

import collections
import struct
import time
import weakref

import numpy as np
import pyarrow as pa
import torch

from .compat import STORAGE_KEYED, storage_key, storage_of

TEMPORARIES, COMM, ACTIVATIONS, OPTIMIZER_STATE, GRADIENTS, PARAMETERS = range(6)
ALLOC, FREE, RECLASS = range(3)
# one event: kind, storage id, bytes, time, category, thread (-1: none), step
_EVENT = struct.Struct("<7q")
_pack = _EVENT.pack
_now = time.perf_counter_ns
_Tensor = torch.Tensor
_is_compiling = torch.compiler.is_compiling


def _unpack_saved(value):
    return value


class _Entry(weakref.ref):
    """A storage in the table: the weak reference whose callback records its free, holding
    what the table knows of it. One object a storage, not a list, a weakref and a lambda: the
    garbage collector's churn from those three was most of a first sight's cost (5.5 against
    1.6 us a storage with the collector off; this shape 0.7 us, docs/overhead.md)."""

    __slots__ = ("key", "sid", "nbytes", "category")


def recording(session) -> "MemoryRecorder | None":
    """The session's memory recorder, its hooks installed, when its options ask for memory."""
    if not session.options.memory:
        return None
    recorder = MemoryRecorder(session)
    recorder.start()
    return recorder


class MemoryRecorder:
    """The storage table of one session and the hooks that fill it."""

    def __init__(self, session):
        self._session = session
        self._live: dict = {}        # storage key (its StorageImpl's address) -> _Entry
        self._on_free = self._freed  # one bound method, every entry's callback
        self._next_id = 0
        self.events: collections.deque = collections.deque()    # packed _EVENTs, unwritten
        self._modules: dict = {}     # id(module) -> weakref: modules walked
        self._undo: list = []
        self._open = False

    @property
    def table(self) -> dict:
        """The storage table, storage key -> :class:`_Entry` (the C ``on_op`` looks outputs
        up in it)."""
        return self._live

    def hand_to_c(self) -> None:
        """Give the session's C ``on_op`` (csrc/onop.c) what it looks outputs up with: the
        table, :meth:`first_sight`, the storage key and the plain tensor type."""
        session = self._session
        session._memory_live, session._memory_seen = self._live, self.first_sight
        session._storage_key, session._tensor_type = storage_key, torch.Tensor

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Install the hooks (before the session's own optimizer hooks, so a step's walks
        land in that step)."""
        from torch.nn.modules import module as _module
        from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                           register_optimizer_step_pre_hook)
        if not STORAGE_KEYED:
            raise RuntimeError("memory=True: this torch's storages have no _cdata to key "
                               "them by (docs/compat.md)")
        self._open = True
        hooks = torch.autograd.graph.saved_tensors_hooks(self._saved, _unpack_saved)
        hooks.__enter__()
        self._undo = [lambda: hooks.__exit__(None, None, None),
                      _module.register_module_forward_pre_hook(self._module_called).remove,
                      _module.register_module_forward_hook(self._module_returned).remove,
                      register_optimizer_step_pre_hook(self._optimizer_begins).remove,
                      register_optimizer_step_post_hook(self._optimizer_ends).remove]

    def close(self, flusher, dictionaries: dict) -> None:
        """Remove the hooks, forget the table (its weakrefs go: no more frees) and write the
        last events."""
        self._open = False
        self._session._memory_seen = None      # the C on_op stops looking outputs up
        for undo in reversed(self._undo):
            try:
                undo()
            except Exception:    # a hook stack the program left unbalanced: nothing to undo
                pass
        self._undo = []
        self._live.clear()
        self._modules.clear()
        self.write(flusher, dictionaries)

    # ------------------------------------------------------------------ hot path
    def outputs(self, out, t0: int, thread: int, comm: bool) -> None:
        """An op's result: each tensor's storage seen for the first time is an allocation by
        the op (its ``t0`` and ``thread`` link it to the op's row)."""
        if type(out) is _Tensor:
            self._see(out, t0, thread, comm)
        elif isinstance(out, (tuple, list)):
            for value in out:
                if isinstance(value, _Tensor):
                    self._see(value, t0, thread, comm)
                elif isinstance(value, (tuple, list)):
                    for inner in value:
                        if isinstance(inner, _Tensor):
                            self._see(inner, t0, thread, comm)

    def _see(self, tensor, t0: int, thread: int, comm: bool) -> None:
        try:
            key = storage_key(tensor)
        except (RuntimeError, NotImplementedError, TypeError):
            return        # sparse, nested, a subclass without storage
        entry = self._live.get(key)
        if entry is None:
            self.first_sight(tensor, key, t0, thread, COMM if comm else TEMPORARIES)
        elif comm and entry.category < COMM:   # a collective wrote into it: DDP's gradient bucket
            self._reclass(entry, COMM)

    def first_sight(self, tensor, key: int, t0: int, thread: int,
                    category: int = TEMPORARIES) -> None:
        """An op made ``tensor``, whose storage (``key``) the table does not hold (the C
        ``on_op`` calls this after its own lookup)."""
        if tensor.is_meta:
            return
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError, TypeError):
            return
        self._new(storage, key, t0, thread, category)

    def _new(self, storage, key: int, t: int, thread: int, category: int) -> None:
        """A storage not in the table (not a meta one: the callers check) becomes an entry."""
        sid, nbytes = self._next_id, storage.nbytes()
        self._next_id = sid + 1
        entry = _Entry(storage, self._on_free)
        entry.key, entry.sid, entry.nbytes, entry.category = key, sid, nbytes, category
        self._live[key] = entry
        self.events.append(_pack(ALLOC, sid, nbytes, t, category, thread,
                                 self._session.step_index))

    def _freed(self, entry: _Entry) -> None:
        if not self._open or self._live.get(entry.key) is not entry:
            return
        del self._live[entry.key]
        if entry.sid >= 0:                         # not already freed by a resize to 0
            self.events.append(_pack(FREE, entry.sid, entry.nbytes, _now(), entry.category, -1,
                                     self._session.step_index))

    def resized(self, storage) -> None:
        """``storage.resize_`` changed a storage's bytes in place (ZeRO-3 and FSDP free a
        parameter's storage with ``resize_(0)`` outside forward and backward, and gather into
        it again): the old bytes are freed, the new ones are a new allocation (a new id) of the
        same category; a storage not seen before is left to its first sight."""
        entry = self._live.get(storage._cdata) if self._open else None
        if entry is None:
            return
        nbytes = storage.nbytes()
        if nbytes == entry.nbytes and entry.sid >= 0:
            return
        step, now = self._session.step_index, _now()
        if entry.sid >= 0:
            self.events.append(_pack(FREE, entry.sid, entry.nbytes, now, entry.category, -1,
                                     step))
        entry.sid, entry.nbytes = -1, nbytes
        if nbytes > 0:
            entry.sid, self._next_id = self._next_id, self._next_id + 1
            self.events.append(_pack(ALLOC, entry.sid, nbytes, now, entry.category, -1, step))

    # ------------------------------------------------------------------ categories
    def claim(self, tensor, category: int) -> None:
        """``tensor``'s storage is (at least) ``category``: an allocation with no op if not
        seen before, else a reclass when the category is a later one."""
        storage = storage_of(tensor)
        if storage is None:
            return
        key = storage._cdata
        entry = self._live.get(key)
        if entry is None:
            if storage.device.type != "meta":
                self._new(storage, key, _now(), -1, category)
        elif category > entry.category:
            self._reclass(entry, category)

    def _reclass(self, entry: _Entry, category: int) -> None:
        entry.category = category
        self.events.append(_pack(RECLASS, entry.sid, entry.nbytes, _now(), category, -1,
                                 self._session.step_index))

    def _saved(self, tensor):
        """autograd saves ``tensor`` for backward: an op's temporary becomes an activation."""
        if self._open and type(tensor) is _Tensor:
            try:
                entry = self._live.get(storage_key(tensor))
            except (RuntimeError, NotImplementedError):
                entry = None
            if entry is not None and entry.category < ACTIVATIONS:
                self._reclass(entry, ACTIVATIONS)
        return tensor

    def _module_called(self, module, args) -> None:
        known = self._modules.get(id(module))
        if (known is not None and known() is module) or _is_compiling() or not self._open:
            return
        try:
            self._modules[id(module)] = weakref.ref(module)
        except TypeError:
            return
        for param in module.parameters():
            self._parameter(param)
        for buffer in module.buffers():
            self.claim(buffer, PARAMETERS)

    def _module_returned(self, module, args, output) -> None:
        """After each call (before the module's own forward hooks): its own parameters are
        parameters, those a wrapper put in for the call too (FSDP2's unsharded parameters,
        gathered into storages it frees with ``resize_(0)``: without this, temporaries or,
        saved for backward, activations)."""
        if self._open and not _is_compiling():
            for param in module._parameters.values():
                if param is not None:
                    self.claim(param, PARAMETERS)

    def _parameter(self, param) -> None:
        self.claim(param, PARAMETERS)
        for grad in (param.grad, getattr(param, "main_grad", None)):
            if isinstance(grad, _Tensor):
                self.claim(grad, GRADIENTS)

    def _optimizer_begins(self, optimizer, args, kwargs) -> None:
        if not self._open:
            return
        for group in optimizer.param_groups:
            for param in group["params"]:
                self._parameter(param)
        # the modules' own parameters too: under ZeRO the optimizer steps shards of them,
        # and their full gradients are gradients all the same
        for ref in list(self._modules.values()):
            module = ref()
            if module is not None:
                for param in module.parameters(recurse=False):
                    self._parameter(param)

    def _optimizer_ends(self, optimizer, args, kwargs) -> None:
        if not self._open:
            return
        for state in list(optimizer.state.values()):
            for value in state.values() if isinstance(state, dict) else ():
                if isinstance(value, _Tensor):
                    self.claim(value, OPTIMIZER_STATE)
                elif isinstance(value, (list, tuple)):
                    for inner in value:
                        if isinstance(inner, _Tensor):
                            self.claim(inner, OPTIMIZER_STATE)

    # ------------------------------------------------------------------ writing
    def write(self, flusher, dictionaries: dict) -> None:
        """The events recorded since the last call, as one batch of memory rows (the
        flusher's thread after each flush, and at close)."""
        queue = self.events
        n = len(queue)
        if not n:
            return
        table = np.frombuffer(b"".join([queue.popleft() for _ in range(n)]),
                              dtype=np.int64).reshape(n, _EVENT.size // 8)
        thread = table[:, 5]
        arrays = {"mem_kind": pa.array(table[:, 0].astype(np.int8)),
                  "mem_storage": pa.array(table[:, 1].astype(np.int32)),
                  "bytes": pa.array(table[:, 2]),
                  "t0": pa.array(table[:, 3]),
                  "mem_category": pa.array(table[:, 4].astype(np.int8)),
                  "thread": pa.array(thread.astype(np.int16), mask=thread < 0),
                  "step": pa.array(table[:, 6].astype(np.int32))}
        with flusher.lock:
            if flusher.writer is not None:
                flusher.writer.write_arrays(arrays, n, dictionaries)
