"""Communication bookkeeping: what each collective is (group, peer, bytes, sequence number) and
when it really completed.

Collectives return before they finish. The hot path queues a launched collective's record with
its ``cid`` and no end; the rest (COMM_ROW) stays in a :class:`CommRecord` until the record is
written, so its ``t1`` can still be filled in by whichever completion signal comes first: the
future of a c10d Work (a callback on the thread that completed it, once it holds the GIL), an
op the rank starts once that future is done (:meth:`CommTracker.before_op`), the end of the
caller's ``Work.wait()`` (the only signal of works without a future: gloo's send/recv and
reduce-scatter), or the ``wait_tensor`` / first use of a functional collective's output. Each
is taken after the completion, never before. A collective written before it completed gets a
separate completion row (``paratrace::complete``), which the reader folds back. A collective
that ended in an error keeps no end time; it is described in the trace's metadata instead.
"""
from __future__ import annotations

import sys
import threading
import weakref
from threading import get_ident as _get_ident
from time import perf_counter_ns as _now
from typing import Optional

import torch
import torch.distributed as dist

from tracer.vocab import ops
from tracer.vocab.labels import PHASE_BACKWARD, PHASE_FORWARD
from tracer.vocab.ops import P2P_KINDS

from . import rows
from .group_names import GroupNames, group_text_of
from .passthrough import recorder_failed

COMM_ROW = rows.COMM_ROW
_future_is_done = torch._C.Future.done       # unbound: one call less than the wrapper's
_future_value = torch._C.Future.value
_current_node = torch._C._current_autograd_node


class CommRecord:
    """One launched collective: its COMM_ROW values and what its description needs."""

    __slots__ = ("kind", "group", "peer", "bytes", "dtype", "async_op", "seq", "cid", "t_ret",
                 "t0", "t1", "phase", "step", "thread", "credit")

    def __init__(self, **values):
        for name, value in values.items():
            setattr(self, name, value)


class CommTracker:
    """Pending collectives of one recording and their completions."""

    def __init__(self, dictionaries, emit):
        self._dicts = dictionaries
        self._emit = emit                  # appends a finished row to the session's queue
        self._groups: dict = {}            # group key -> (group id, ranks)
        # what the user or DeviceMesh called each group (the flusher writes it into the trace)
        self.names = GroupNames()
        self._group_seq: dict = {}
        self._next_cid = 0
        self.pending: dict = {}            # cid -> CommRecord, launched but not completed
        self._unwritten: dict = {}         # cid -> CommRecord whose launch is not written yet
        self._flushed_pending: set = set()
        self.funcol: dict = {}             # id(output) -> (weakref, CommRecord)
        self.works: dict = {}              # id(Work) -> (Work, CommRecord) until completed
        self.futures: dict = {}            # cid -> (its work's future, CommRecord), not yet done
        self.last: Optional[dict] = None   # the last collective launched, described
        self.failed: list = []             # collectives that ended in an error, described
        # thread ident -> (module id, forward stack id) its collectives are credited to, in
        # place of the running module's and autograd node's (fsdp_credit.py: FSDP's parameters)
        self.owners: dict = {}
        self.lock = threading.Lock()

    # ------------------------------------------------------------------ launch
    def launch(self, comm, args, out, t0: int, t_ret: int, phase: int, step: int,
               thread: int) -> int:
        """Register a collective the hot path just ran (``t_ret``: when its call returned);
        returns its cid, for the record the hot path queues."""
        gid, ranks = self._group(comm, args)
        peer = None
        if comm.peer_arg is not None and comm.peer_arg < len(args):
            local = args[comm.peer_arg]
            if isinstance(local, int):
                peer = ranks[local] if 0 <= local < len(ranks) else local
        nbytes, dtype = 0, None
        if comm.input_arg is not None and comm.input_arg < len(args):
            nbytes, dtype = _tensor_bytes(args[comm.input_arg])
        if dtype is None and comm.output_arg is not None and comm.output_arg < len(args):
            # a rank that hands nothing (a scatter's receivers) records what it receives, so
            # that every member of the collective names the same dtype; its bytes stay 0
            dtype = _tensor_bytes(args[comm.output_arg])[1]
        async_op = None
        if comm.async_arg is not None:
            # NOTE: the dispatcher drops trailing arguments left at their default (async_op
            # defaults to True in the c10d schemas), so a missing flag means the default
            async_op = bool(args[comm.async_arg]) if comm.async_arg < len(args) \
                else comm.async_default
        elif comm.api == "functional":
            async_op = True
        # two counts per process group, as Flight Recorder keeps them: its collectives, which
        # every member numbers alike, and its point-to-point operations, which pairs of
        # members issue in whatever numbers their schedule needs
        counter = (gid, comm.kind in P2P_KINDS)
        seq = self._group_seq.get(counter, 0)
        self._group_seq[counter] = seq + 1
        cid = self._next_cid
        self._next_cid += 1
        record = CommRecord(kind=self._dicts.kind(comm.kind), group=gid, peer=peer,
                            bytes=nbytes, dtype=None if dtype is None else self._dicts.dtype(dtype),
                            async_op=async_op, seq=seq, cid=cid, t_ret=t_ret, t0=t0, t1=None,
                            phase=phase, step=step, thread=thread,
                            credit=self.owners.get(_get_ident()) if self.owners else None)
        self.pending[cid] = self._unwritten[cid] = record
        self.last = {"kind": comm.kind, "group": self._dicts.group.values[gid], "seq": seq,
                     "peer": peer, "bytes": nbytes, "t0": t0, "step": step}
        if comm.api == "c10d":
            work = out[-1] if isinstance(out, (tuple, list)) else out
            self._track_work(work, record)
        else:
            try:
                self.funcol[id(out)] = (weakref.ref(out), record)
            except TypeError:
                self.complete(record, t_ret)
        return cid

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
            text = group_text_of(pg, ranks) if ranks else f"?{key}"
            gid = self._dicts.group(text)
            cached = self._groups[key] = (gid, ranks)
            self.names.desc(text, pg)
        return cached

    # ------------------------------------------------------------------ c10d works
    def _track_work(self, work, record) -> None:
        """Completion of a c10d collective: the first of its future's callback, an op started
        once the future is done (:meth:`before_op`) and the end of its wait()."""
        try:
            if isinstance(work, torch.ScriptObject):
                work = torch._C._distributed_c10d.Work.unbox(work)
        except Exception:
            self.complete(record, record.t_ret)
            return
        # NOTE: gloo's send/recv and reduce-scatter works have no future, and waiting on them
        # from a second thread deadlocks; their completion is the end of the caller's own
        # wait() (wait_hook), which also completes a work whose callback still waits for the GIL
        self.works[id(work)] = (work, record)
        try:
            fut = work.get_future()
        except Exception:
            return
        fut.add_done_callback(lambda f, rec=record, key=id(work): self._future_done(f, rec, key))
        if record.cid in self.pending:       # the callback did not run at once
            self.futures[record.cid] = (fut, record)

    def _future_done(self, fut, record, key) -> None:
        t = _now()
        self.works.pop(key, None)
        try:
            fut.value()
        except Exception as exc:   # e.g. a peer died: the collective never completed
            self._failed(record, exc)
            return
        self.complete(record, t)

    def work_waited(self, work, t: int) -> None:
        """A ``Work.wait()`` returned at ``t`` (:func:`wait_hook`): the work's collective had
        completed by then, whatever its future's callback says later."""
        record = self._take_work(work)
        if record is not None:
            self.complete(record, t)

    def work_failed(self, work, exc) -> None:
        """A ``Work.wait()`` raised: the work's collective never completed."""
        record = self._take_work(work)
        if record is not None:
            self._failed(record, exc)

    def _take_work(self, work):
        # NOTE: pybind11 keeps one Python object per live C++ Work, and self.works holds the one
        # that launch unboxed, so the caller's work is that very object (checked on torch 2.13:
        # every c10d API, sync and async, coalesced, batch_isend_irecv); a new object of the
        # same id after the entry went is not the tracked work, hence the identity test
        if not self.works:
            return None
        item = self.works.pop(id(work), None)
        if item is None:
            return None
        if item[0] is not work:
            self.works[id(work)] = item
            return None
        return item[1]

    def _failed(self, record, exc) -> None:
        """A collective that ended in an error keeps no end time; the error goes to the meta."""
        with self.lock:
            if self.pending.pop(record.cid, None) is None:
                return
            self._flushed_pending.discard(record.cid)
            self.futures.pop(record.cid, None)
            failure = self.describe(record)
            first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            failure["error"] = f"{type(exc).__name__}: {first_line}"[:500]
            self.failed.append(failure)

    # ------------------------------------------------------------------ completion
    def complete(self, record, t) -> None:
        with self.lock:
            cid = record.cid
            self.futures.pop(cid, None)
            if self.pending.pop(cid, None) is None:
                return
            if cid in self._flushed_pending:
                self._flushed_pending.discard(cid)
                self._emit(rows.record(t0=t, t1=t, op=self._dicts.op(ops.OP_COMPLETE),
                                       phase=record.phase, step=record.step, thread=record.thread,
                                       cid=cid))
            else:
                record.t1 = t

    def before_op(self, args) -> None:
        """What the hot path settles before it runs an op while collectives are pending.

        A c10d work's future that is done completed before this op started, even if its
        callback has not run: the callback waits for the GIL, which this thread holds, and can
        land milliseconds later (DDP's finalize waits for its buckets' futures in C++, not in
        ``Work.wait()``, then copies them into the gradients; a late callback left that wait in
        no gap the timeline could see: 13 of 60 bucket all-reduces of a 2-rank run, up to
        12 ms). The time is taken after ``done()`` said so, never before the completion. An
        op about to consume an AsyncCollectiveTensor waits for it first: time that wait."""
        if self.futures:
            for cid, (fut, record) in list(self.futures.items()):
                if _future_is_done(fut):
                    t = _now()
                    try:
                        _future_value(fut)
                    except Exception:          # its callback reports the error
                        self.futures.pop(cid, None)
                        continue
                    self.complete(record, t)
        if self.funcol:
            self.await_async_args(args)

    def await_async_args(self, args) -> None:
        """An op about to consume an AsyncCollectiveTensor waits for it first: time that wait."""
        for a in args:
            if type(a).__name__ != "AsyncCollectiveTensor":
                continue
            record = self.funcol_take(a)
            if record is not None:
                a.trigger_wait()
                self.complete(record, _now())

    def funcol_take(self, tensor):
        """The pending functional collective whose output ``tensor`` is (or wraps), or None."""
        target = getattr(tensor, "elem", tensor) \
            if type(tensor).__name__ == "AsyncCollectiveTensor" else tensor
        item = self.funcol.get(id(target))
        if item is None or item[0]() is not target:
            return None
        del self.funcol[id(target)]
        return item[1]

    def written(self, cids) -> list:
        """The CommRecords of the launches among records about to be written, given their cids
        in order (None for the other records with a cid: waits and completions, which follow
        their launch). A launch still pending gets a completion row when it completes. Call
        with :attr:`lock` held."""
        records = []
        for cid in cids:
            record = self._unwritten.pop(int(cid), None)
            if record is not None and record.t1 is None and record.cid in self.pending:
                self._flushed_pending.add(record.cid)
            records.append(record)
        return records

    # ------------------------------------------------------------------ descriptions
    def describe(self, record: CommRecord) -> dict:
        """A collective as the status file and the trace's metadata describe it."""
        return {"kind": self._dicts.kind.values[record.kind],
                "group": self._dicts.group.values[record.group], "seq": record.seq,
                "peer": record.peer, "bytes": record.bytes, "t0": record.t0,
                "step": record.step}

    def inflight(self) -> list:
        return [self.describe(r) for r in list(self.pending.values())]


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


def wait_hook(session):
    """The recorder's ``Work.wait()`` (tracer/recorder/patches/distributed.py installs it): its end
    completes the work's collective, and the ops a backend runs inside it are not recorded.

    NOTE: gloo's reduce-scatter (``_reduce_scatter_base``, ``reduce_scatter_tensor_coalesced``)
    is an all-reduce whose work, a LambdaWork with no future, waits for it in ``wait()`` and then
    copies this rank's chunk out (``aten.split``, ``aten.copy_``) on the waiting thread, through
    the dispatcher. Recorded, those ops split the wait in two: the time blocked before them held
    no completion and counted as compute (the reference GPT, tp 2 + SP: median 0.6 ms, up to
    8 ms a reduce-scatter). They are the collective's own work, as the same copies inside a
    functional collective's ``wait_tensor`` (never seen, being inside an op): the mode steps
    off this thread's dispatch stack for the wait (only the thread that entered it can)."""
    tracker = session.comm

    def wait(original, work, args, kwargs):
        mode = session.mode
        off = mode is not None and _get_ident() == session.owner and mode.suspend()
        try:
            result = original(work, *args, **kwargs)
            t = _now()
        except Exception as exc:
            tracker.work_failed(work, exc)
            raise
        finally:
            if off:
                mode.resume()
        if result is not False:             # False: a wait that timed out without raising
            tracker.work_waited(work, t)
        return result

    return wait


def special_op(session, special, func, args, kwargs, op_id):
    """The hot path's special ops (ops.classify): the wait of a functional collective (it
    completes its collective and takes its phase), record_function ranges and higher-order
    operators (hops.py)."""
    if special == ops.HOP:
        return session.hops(func, args, kwargs)
    t0 = _now()
    out = func(*args, **kwargs)
    try:     # the recorder's own work: a failure puts the rank into passthrough (passthrough.py)
        if special == ops.WAIT:
            _waited(session, args, kwargs, op_id, t0, _now())
        elif special == ops.RF_ENTER:
            session.open_ranges += 1
            name = args[0] if args else kwargs.get("name", "?")
            entry = session.annotations.push(str(name), {"source": "record_function"})
            session.annotations.open_record_function(entry, _now())
        elif special == ops.RF_EXIT:
            session.open_ranges = max(0, session.open_ranges - 1)
            opened = session.annotations.close_record_function()
            if opened is not None:
                session.close_range(*opened)
    except Exception as exc:
        recorder_failed(session, exc)
    return out


def _waited(session, args, kwargs, op_id: int, t0: int, t1: int) -> None:
    """The wait of a functional collective ran: it completes its collective, and takes its
    phase."""
    tracker = session.comm
    pending = tracker.funcol_take(args[0] if args else kwargs.get("tensor"))
    cid = None
    if pending is not None:
        cid = pending.cid
        tracker.complete(pending, t1)
    # the frame that dispatched the op (_waited <- special_op <- on_op <- __torch_dispatch__ <-
    # it)
    try:
        frame = sys._getframe(4)
    except ValueError:   # no Python frame called it (autograd's device threads)
        frame = None
    stack = None if not session.options.record_stacks else \
        session.stacks.capture(frame) if frame is not None else session.stacks.empty()
    hint = session.annotations.phase_hint
    phase = pending.phase if pending is not None else PHASE_BACKWARD \
        if _current_node() is not None else (hint if hint is not None else PHASE_FORWARD)
    session.push(rows.record(
        t0=t0, t1=t1, op=op_id, phase=phase, module=session.modules.current, stack=stack,
        annotation=session.annotations.current, step=session.step_index,
        thread=session.thread_number(), cid=cid))
