"""Memory recording's storage table (memory_recorder.py): every storage seen alive, keyed by its
StorageImpl's address, and the events recorded on it (allocations, frees, reclasses), in the
order they happened. This is the Python twin of csrc/hotpath/storagetable.c's ``StorageTable``: the
same steps on the same kind of table. The C one runs with the C ``on_op`` (which calls it
without a Python frame); this one runs where the C hot path is not built or the Python twins
run (``PARATRACE_PURE_PYTHON=1``, the Python hot path benchmarks/overhead.py measures), and
tests/integration/test_hotpath.py holds the two to the same memory rows.

What a table does, in both:

- an op's outputs (:meth:`~PyStorageTable.outputs`): a storage not in the table is an
  allocation by the op (its ``t0`` and thread link it to the op's row), whose entry is a weak
  reference with a callback: torch keeps a storage's Python object alive as long as its C++
  storage lives, so the callback records the real free. An op whose schema says it returns
  only its arguments or views of them (views, in-place and ``out=`` ops: more than half the
  ops of a training step) makes no storage and is not looked at, unless a collective wrote
  into it;
- a node of the autograd graph running in backward (:meth:`~PyStorageTable.node_runs`, at its
  first op): what it saved for backward is activations. The saved tensors are read from the
  node itself (compat.saved_tensors: what autograd holds, without unpacking it), not through
  a ``saved_tensors_hooks`` pack hook: hooks change what autograd dispatches (each saved
  tensor unpacked in backward becomes an ``aten.detach`` through the recording mode, the saved
  outputs' in forward do not), so the recording would differ with memory on. What a pack hook
  of the program's own kept instead of a tensor (checkpointing's holder) is no storage here;
- walks (:meth:`~PyStorageTable.claim`): a storage is at least a category; one not seen before
  is an allocation with no op;
- ``resize_`` (:meth:`~PyStorageTable.resized`), and :meth:`~PyStorageTable.take` for the
  flusher: the events since the last take, as packed ``EVENT`` rows.
"""
from __future__ import annotations

import struct
import time
import weakref

import torch

from ..compat import (local_tensor, returns_only_aliases, saved_tensor_names, saved_tensors,
                     storage_key)

TEMPORARIES, COMM, ACTIVATIONS, OPTIMIZER_STATE, GRADIENTS, PARAMETERS = range(6)
ALLOC, FREE, RECLASS = range(3)
# one event: kind, storage id, bytes, time, category, thread (-1: none), step
EVENT = struct.Struct("<7q")
_pack = EVENT.pack
_now = time.perf_counter_ns
_Tensor = torch.Tensor
_NO_STORAGE = (RuntimeError, NotImplementedError, TypeError)   # sparse, nested, subclasses


class _Entry(weakref.ref):
    """A storage in the table: the weak reference whose callback records its free, holding
    what the table knows of it. One object a storage, not a list, a weakref and a lambda: the
    garbage collector's churn from those three was most of a first sight's cost (5.5 against
    1.6 us a storage with the collector off; this shape 0.7 us, docs/overhead.md)."""

    __slots__ = ("key", "sid", "nbytes", "category")


class PyStorageTable:
    """The storage table of one session (``session.step_index`` is each event's step)."""

    def __init__(self, session):
        self._session = session
        self.live: dict = {}          # storage key (its StorageImpl's address) -> _Entry
        self._on_free = self._freed   # one bound method, every entry's callback
        self._next_id = 0
        self._events: list = []       # packed EVENTs since the last take
        self._names: dict = {}        # node type -> its saved tensors' names
        self._aliasing: dict = {}     # id(op overload) -> it returns only aliases
        self._last_node = (-1, None)  # (sequence number, type) of the node last read
        self._open = True

    # ------------------------------------------------------------------ hot path
    def outputs(self, func, out, t0: int, thread: int, comm: bool) -> None:
        """Op overload ``func``'s result: each tensor's storage seen for the first time is an
        allocation by the op; a storage a collective wrote into is at least comm (DDP's
        gradient bucket)."""
        if not comm:
            only = self._aliasing.get(id(func))
            if only is None:     # NOTE: by id: an overload hashes in Python; torch keeps it
                only = self._aliasing[id(func)] = returns_only_aliases(func)
            if only:
                return
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
        except _NO_STORAGE:
            return
        entry = self.live.get(key)
        if entry is not None:
            if comm and entry.category < COMM:
                self._reclass(entry, COMM)
            return
        if tensor.is_meta:
            return
        try:
            storage = tensor.untyped_storage()
        except _NO_STORAGE:
            return
        self._new(storage, key, t0, thread, COMM if comm else TEMPORARIES)

    def node_runs(self, node, nseq: int) -> None:
        """``node`` (its sequence number ``nseq``) runs in backward: the tensors autograd holds
        for it are activations (read once a node: again only when another node ran in
        between)."""
        kind = type(node)
        if not self._open or (nseq, kind) == self._last_node:
            return
        self._last_node = (nseq, kind)
        names = self._names.get(kind)
        if names is None:
            names = self._names[kind] = saved_tensor_names(kind)
        for name in names:
            try:
                saved = getattr(node, name)
            except RuntimeError:   # released already: AOT autograd's backward frees its first
                continue           # (compiled.py read them before, in the node's pre-hook)
            for tensor in saved_tensors(saved):
                self.saved(tensor)

    def saved(self, tensor) -> None:
        """autograd keeps ``tensor`` for backward: an op's temporary (or a collective's
        buffer) becomes an activation."""
        if self._open and type(tensor) is _Tensor:
            try:
                entry = self.live.get(storage_key(tensor))
            except (RuntimeError, NotImplementedError):
                return
            if entry is not None and entry.category < ACTIVATIONS:
                self._reclass(entry, ACTIVATIONS)

    # ------------------------------------------------------------------ categories
    def claim(self, tensor, category: int) -> None:
        """``tensor``'s storage (a DTensor's: its shard's) is at least ``category``: an
        allocation with no op if not seen before, else a reclass when the category is a
        later one. A storage already there at that category costs one lookup."""
        if not self._open:
            return
        local = tensor if type(tensor) is _Tensor else local_tensor(tensor)
        try:
            key = storage_key(local)
        except _NO_STORAGE + (AttributeError,):
            return
        entry = self.live.get(key)
        if entry is not None:
            if category > entry.category:
                self._reclass(entry, category)
        elif not local.is_meta:
            self._new(local.untyped_storage(), key, _now(), -1, category)

    def resized(self, storage) -> None:
        """``storage.resize_`` changed a storage's bytes in place (ZeRO-3 and FSDP free a
        parameter's storage with ``resize_(0)`` outside forward and backward, and gather into
        it again): the old bytes are freed, the new ones are a new allocation (a new id) of the
        same category; a storage not seen before is left to its first sight."""
        entry = self.live.get(storage._cdata) if self._open else None
        if entry is None:
            return
        nbytes = storage.nbytes()
        if nbytes == entry.nbytes and entry.sid >= 0:
            return
        step, now = self._session.step_index, _now()
        if entry.sid >= 0:
            self._events.append(_pack(FREE, entry.sid, entry.nbytes, now, entry.category, -1,
                                      step))
        entry.sid, entry.nbytes = -1, nbytes
        if nbytes > 0:
            entry.sid, self._next_id = self._next_id, self._next_id + 1
            self._events.append(_pack(ALLOC, entry.sid, nbytes, now, entry.category, -1, step))

    # ------------------------------------------------------------------ events
    def _new(self, storage, key: int, t: int, thread: int, category: int) -> None:
        sid, nbytes = self._next_id, storage.nbytes()
        self._next_id = sid + 1
        entry = _Entry(storage, self._on_free)
        entry.key, entry.sid, entry.nbytes, entry.category = key, sid, nbytes, category
        self.live[key] = entry
        self._events.append(_pack(ALLOC, sid, nbytes, t, category, thread,
                                  self._session.step_index))

    def _freed(self, entry: _Entry) -> None:
        if not self._open or self.live.get(entry.key) is not entry:
            return
        del self.live[entry.key]
        if entry.sid >= 0:                         # not already freed by a resize to 0
            self._events.append(_pack(FREE, entry.sid, entry.nbytes, _now(), entry.category,
                                      -1, self._session.step_index))

    def _reclass(self, entry: _Entry, category: int) -> None:
        entry.category = category
        self._events.append(_pack(RECLASS, entry.sid, entry.nbytes, _now(), category, -1,
                                  self._session.step_index))

    def take(self) -> bytes:
        """The events since the last take, packed (``EVENT`` each), in order."""
        events, self._events = self._events, []
        return b"".join(events)

    def close(self) -> None:
        """Forget the table (its weak references go: no more frees); events stay to take."""
        self._open = False
        self.live.clear()
