"""The hot path's Python side: :class:`OpPath`, the base of Session that takes each dispatched op.

The private dispatch mode (``hotpath/_mode.py``) hands each op to :meth:`OpPath.on_op`. Where the
C extension is built its base is the C ``SessionState`` (csrc/hotpath/sessiontypes.c), whose
members are the fields on_op reads, and csrc/hotpath/onop.c runs plain ops without this frame;
``on_op`` here is its twin (docs/recorder.md). Session (session.py) owns the state it reads.
"""
from __future__ import annotations

import sys
import threading
import time

import torch

from tracer.vocab.labels import (PHASE_BACKWARD, PHASE_FORWARD, PHASE_GRAD_SYNC, PHASE_OPTIMIZER,
                                 PHASE_OTHER, PHASE_RECOMPUTE)

from . import rows
from .comm import special_op
from .frameworks.dtensor import function_phase
from .hotpath._mode import op_entry
from .hotpath._native import native_hot_path
from .passthrough import recorder_failed
from .process import process_group

_now = time.perf_counter_ns
_current_node = torch._C._current_autograd_node
_grad_enabled = torch.is_grad_enabled
_graph_task = getattr(torch._C, "_current_graph_task_id", lambda: -1)
_get_ident = threading.get_ident
_getframe = sys._getframe
_pack = rows.RECORD.pack
sequence_nr = torch.autograd._get_sequence_nr      # in every torch of the range
_sequence_nr = sequence_nr
TORCH_STATE = (_current_node, _grad_enabled, _graph_task, _sequence_nr)   # what C calls

MAX_QUEUE = 200_000          # events held in memory before the hot path flushes itself
MAX_NODES = 1 << 18          # forward autograd nodes remembered (this and the last window)
# on_op's common path in C (csrc/hotpath/onop.c): the fields it reads are its base's members
NATIVE = native_hot_path()
_SessionState = getattr(NATIVE, "SessionState", object)
C_ON_OP = _SessionState is not object     # built, and not PARATRACE_PURE_PYTHON


class OpPath(_SessionState):
    """Session's hot path: :meth:`on_op` and the thread numbers it writes (Session sets every
    field it reads)."""

    def on_op(self, func, args, kwargs):
        """Run one dispatched op and queue its row (OP_ROW, then COMM_ROW for collectives).

        The hot path: every aten op of a recorded step comes through here, so it reads cached
        specs, packs one record and leaves everything else to the flusher. Outside recorded
        steps the mode is off the dispatch stack and nothing here runs. Where the C extension
        is built, csrc/hotpath/onop.c does the same for plain ops, step for step, without
        this frame (the mode's __torch_dispatch__ is C, hotpath/_mode.py); this method is its
        twin, and takes the rest: collectives, special ops, an op's first call, tensor subclasses.
        A failure of the recorder's own work puts the rank into passthrough (passthrough.py):
        the op runs, or has run, and returns its result.
        """
        entry = self._specs.get(id(func))
        if entry is None:
            try:
                entry = op_entry(self._specs, self.op_ids, func)
            except Exception as exc:
                recorder_failed(self, exc)
                return func(*args, **kwargs)
        if self.passthrough:
            return entry[3](*args, **kwargs)
        op_id, comm, special, call, _ = entry
        try:
            if self.device_wanted and not self.open_ranges:
                self._start_device()
            if special is None and comm is not None and not self.pg_seen:
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
            if node is None or self.recompute:
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
                            self.fwd_of_node[n] = origin
                    else:                     # usually the one node this op made
                        self.fwd_of_node[seq - 1] = origin
                    self._last_seq = seq
                    if len(self.fwd_of_node) > MAX_NODES:   # a run that never steps stays bounded
                        self.fwd_prev, self.fwd_of_node = self.fwd_of_node, {}
                if node is not None:      # checkpointing replays it: recompute, unless annotated
                    phase = PHASE_RECOMPUTE if hint is None or hint <= PHASE_BACKWARD else hint
                elif hint is not None:
                    phase = hint
                elif self.in_optimizer:
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
                origin = self.fwd_of_node.get(nseq)
                if origin is None:
                    origin = self.fwd_prev.get(nseq, 0)
                fwd_stack = (origin >> 32) - 1
                module = (origin & 0xFFFFFFFF) - 1
                stack = -1 if not self._record_stacks else \
                    self._capture(frame) if frame is not None else self._stacks.empty()
            thread = self._threads.get(_get_ident())
            if thread is None:
                thread = self.thread_number()
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
            self.push(_pack(t0, t1 if cid < 0 else -1, op_id, phase, module, stack, fwd_stack,
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

    def thread_number(self) -> int:
        """The calling thread's small number in the trace (a new thread gets the next one); C's
        on_op asks it by name for a thread it has not seen."""
        ident = _get_ident()
        thread = self._threads.get(ident)
        if thread is None:
            thread = self._threads[ident] = len(self._threads)
            self._flusher.merge_meta("threads", {str(thread): ident})   # for CUPTI's thread ids
        return thread
