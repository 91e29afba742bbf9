"""Memory recording (``tracer.trace(memory=True)``): every storage this process's ops make, its
bytes, when it was freed and what it is kept for, written as memory rows of the trace
(docs/trace-format.md, "Memory"; the mechanism measured in docs/overhead.md, "Memory tracking").

The mechanism: a storage table (storage_table.py; its C twin, csrc/hotpath/storagetable.c, runs with
the C hot path, which calls it without a Python frame), fed by the hot path: each op's outputs
(an allocation on first sight, a weak reference with a callback for the free) and, in
backward, what each node saved for it (activations). Each storage is keyed by its
StorageImpl's address (``_cdata``, read with compat.storage_key: unique while alive; zero-byte
storages, whose data pointer is 0, do not collide). This module adds what the hot path does
not see: storages made before the recording (parameters, optimizer state), found by walks: a
module's parameters, buffers and gradients when the module is first called, an optimizer's
parameters and gradients before each step and its state after it; one not seen before is an
allocation with no op (thread null). Memory recording adds no op and changes no op's row: it
installs no ``saved_tensors_hooks`` (storage_table.py says why).

Categories (format.MEMORY_CATEGORIES, in this order): a storage starts as ``comm`` when a
collective made it, else ``temporaries``; it moves only later in the list, never back, each
move a ``reclass`` row:

- ``comm``: a temporary a collective writes into in place (DDP's gradient buckets, made by
  ``aten.empty`` and all-reduced each step; FSDP2's all-gather and reduce-scatter buffers);

- ``activations``: a temporary or comm storage autograd saved for a backward that ran: read
  from each node when it runs, and from a non-reentrant checkpoint's frame when it recomputes
  (its inputs); under ``saved_tensors_hooks`` of the program's own, what their pack hook
  kept (torch.utils.checkpoint's, inside the checkpointed region: a holder, no storage);
- ``optimizer_state``: a tensor in an optimizer's ``state`` after its step;
- ``gradients``: a parameter's ``.grad`` (or ``.main_grad``), before each optimizer step and
  when its module is first seen;
- ``parameters``: a module's parameters and buffers, an optimizer's parameters, and a
  module's own parameters after each of its calls (those a wrapper swapped in for the call:
  FSDP2's unsharded parameters).

The reader and viz/analysis/memory/live_bytes.py take a storage's last category for its whole
life (it was made to be that: a gradient is first an op's output in backward; an activation is
found when its backward runs). Not seen: storages only ops' inputs carry (a batch made before
the recording), allocations freed inside one op, and storages of steps outside ``steps``
(their frees still count); the CPU allocator's rounding; tensors saved for a backward that
never runs stay temporaries.
"""
from __future__ import annotations

import weakref

import numpy as np
import pyarrow as pa
import torch
from torch.nn.modules import module as _module
from torch.optim.optimizer import (register_optimizer_step_post_hook,
                                   register_optimizer_step_pre_hook)

from ..hotpath._native import native_hot_path
from ..compat import STORAGE_KEYED, checkpoint_inputs, returns_only_aliases, storage_key
from .storage_table import (EVENT, GRADIENTS, OPTIMIZER_STATE, PARAMETERS, PyStorageTable)

_Tensor = torch.Tensor
_is_compiling = torch.compiler.is_compiling
_FIELDS = EVENT.size // 8


def recording(session, in_c: bool) -> "MemoryRecorder | None":
    """The session's memory recorder, its hooks installed, when its options ask for memory;
    ``in_c``: the session's ops take the C on_op, which gets the C table."""
    if not session.options.memory:
        return None
    recorder = MemoryRecorder(session, in_c)
    recorder.start()
    if recorder.in_c:                  # the C on_op calls the C table itself (csrc/hotpath/onop.c)
        session.memory_table = recorder.table
    return recorder


class MemoryRecorder:
    """The storage table of one session and the hooks and walks that fill it."""

    def __init__(self, session, in_c: bool):
        self._session = session
        hot = native_hot_path()
        self.in_c = bool(in_c and hot is not None)
        self.table = hot.StorageTable(session, storage_key, _Tensor, returns_only_aliases) \
            if self.in_c else PyStorageTable(session)
        self._modules: dict = {}     # id(module) -> weakref: modules walked
        self._module_hooks: list = []   # the global module hooks' handles, in recorded steps
        self._undo: list = []
        self._open = False

    @property
    def live(self) -> dict:
        """The storage table, storage key -> its entry (a weak reference to the storage)."""
        return self.table.live

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Install the hooks (before the session's own optimizer hooks, so a step's walks
        land in that step)."""
        if not STORAGE_KEYED:
            raise RuntimeError("memory recording: this torch's storages have no _cdata to key "
                               "them by (docs/compat.md); memory=False (trace-run "
                               "--no-memory) records ops only")
        self._open = True
        self._undo = [register_optimizer_step_pre_hook(self._optimizer_begins).remove,
                      register_optimizer_step_post_hook(self._optimizer_ends).remove]
        self.follow_window(self._session.recording)

    def follow_window(self, recording: bool) -> None:
        """The global module hooks are on in recorded steps only: outside them a step runs as
        it would untraced (the optimizer walks skip those steps; frees are still seen)."""
        if recording and not self._module_hooks:
            self._module_hooks = [
                _module.register_module_forward_pre_hook(self._module_called),
                _module.register_module_forward_hook(self._module_returned)]
        elif not recording:
            for handle in self._module_hooks:
                handle.remove()
            self._module_hooks = []

    def close(self, flusher, dictionaries: dict) -> None:
        """Remove the hooks, forget the table (its weakrefs go: no more frees) and write the
        last events."""
        self._open = False
        if self.in_c:
            self._session.memory_table = None     # the C on_op stops calling the table
        self.follow_window(False)
        for undo in reversed(self._undo):
            undo()
        self._undo = []
        self.table.close()
        self._modules.clear()
        self.write(flusher, dictionaries)

    def detach(self) -> None:
        """In a child forked while recording (exits.py): nothing more is recorded or written
        (the module hooks go, the optimizer hooks stay and do nothing, the table forgets its
        storages: no free is seen)."""
        self._open = False
        self.follow_window(False)
        self.table.close()

    def recomputes(self, frame) -> None:
        """A non-reentrant checkpoint recomputes: the inputs it saved for that are
        activations (patches/autograd.py; its input saver's node never runs)."""
        for tensor in checkpoint_inputs(frame):
            self.table.saved(tensor)

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
            self.table.claim(buffer, PARAMETERS)

    def _module_returned(self, module, args, output) -> None:
        """After each call (before the module's own forward hooks): its own parameters are
        parameters, those a wrapper put in for the call too (FSDP2's unsharded parameters,
        gathered into storages it frees with ``resize_(0)``: without this, temporaries or,
        saved for backward, activations)."""
        if self._open and not _is_compiling():
            for param in module._parameters.values():
                if param is not None:
                    self.table.claim(param, PARAMETERS)

    def _parameter(self, param) -> None:
        """A parameter and its gradients (``.grad``; Megatron's ``.main_grad``). The table's
        claim of a storage it holds at that category already is one lookup: a walk costs
        little where nothing changed (a step's new gradients are the usual change)."""
        claim = self.table.claim
        claim(param, PARAMETERS)
        for grad in (param.grad, getattr(param, "main_grad", None)):
            if isinstance(grad, _Tensor):
                claim(grad, GRADIENTS)

    def _optimizer_begins(self, optimizer, args, kwargs) -> None:
        if not self._open or self._session.passthrough:    # not a recorded step
            return
        walked = set()
        for group in optimizer.param_groups:
            for param in group["params"]:
                walked.add(id(param))
                self._parameter(param)
        # the modules' other parameters too: under ZeRO the optimizer steps shards of them,
        # and their full gradients are gradients all the same
        for ref in list(self._modules.values()):
            module = ref()
            for param in module._parameters.values() if module is not None else ():
                if param is not None and id(param) not in walked:
                    walked.add(id(param))
                    self._parameter(param)

    def _optimizer_ends(self, optimizer, args, kwargs) -> None:
        if not self._open or self._session.passthrough:
            return
        for state in list(optimizer.state.values()):
            for value in state.values() if isinstance(state, dict) else ():
                if isinstance(value, _Tensor):
                    self.table.claim(value, OPTIMIZER_STATE)
                elif isinstance(value, (list, tuple)):
                    for inner in value:
                        if isinstance(inner, _Tensor):
                            self.table.claim(inner, OPTIMIZER_STATE)

    # ------------------------------------------------------------------ writing
    def write(self, flusher, dictionaries: dict) -> None:
        """The events recorded since the last call, as one batch of memory rows (the
        flusher's thread after each flush, and at close)."""
        data = self.table.take()
        if not data:
            return
        table = np.frombuffer(data, dtype=np.int64).reshape(-1, _FIELDS)
        n = len(table)
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
