"""Communication bookkeeping: what each collective is (group, peer, bytes, sequence number) and
when it really completed.

Collectives return before they finish. A launched collective's row stays a *list* while it is
pending, so its ``t1`` can still be filled in by whichever completion signal comes: the future
of a c10d Work (a callback, possibly on another thread), the end of the caller's ``Work.wait()``
(works without a future: gloo's send/recv), or the ``wait_tensor`` / first use of a functional
collective's output. A pending row that was flushed before it completed gets a separate
completion row (``paratrace::complete``), which the reader folds back. A collective that ended in
an error keeps no end time; it is described in the trace's metadata instead.
"""
from __future__ import annotations

import threading
import weakref
from time import perf_counter_ns as _now
from typing import Optional

import torch
import torch.distributed as dist

from . import ops
from .format import COL, make_row

# The fields a collective's launch appends to the hot path's row (session.OP_ROW), in order.
COMM_ROW = ("kind", "group", "peer", "bytes", "dtype", "async_op", "seq", "cid", "t_ret")


class CommTracker:
    """Pending collectives of one recording and their completions."""

    def __init__(self, dictionaries, emit):
        self._dicts = dictionaries
        self._emit = emit                  # appends a finished row to the session's queue
        self._groups: dict = {}            # group key -> (group id, ranks)
        self._group_seq: dict = {}
        self._next_cid = 0
        self.pending: dict = {}            # cid -> row, collectives launched but not completed
        self._flushed_pending: set = set()
        self.funcol: dict = {}             # id(output) -> (weakref, row)
        self.works: dict = {}              # id(Work) -> (Work, row) until waited or completed
        self.last: Optional[dict] = None   # the last collective launched, described
        self.failed: list = []             # collectives that ended in an error, described
        self.lock = threading.Lock()

    # ------------------------------------------------------------------ launch
    def launch(self, comm, args, out, base: tuple) -> list:
        """The row of a collective the hot path just ran (``base``: its op row), still pending."""
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
        t_ret = row[COL.t1]
        row[COL.t1] = None
        # in COMM_ROW order
        row += [self._dicts.kind(comm.kind), gid, peer, nbytes,
                None if dtype is None else self._dicts.dtype(dtype), async_op, seq, cid, t_ret]
        self.pending[cid] = row
        self.last = {"kind": comm.kind, "group": list(ranks), "seq": seq, "peer": peer,
                     "bytes": nbytes, "t0": row[COL.t0], "step": row[COL.step]}
        if comm.api == "c10d":
            work = out[-1] if isinstance(out, (tuple, list)) else out
            self._track_work(work, row)
        else:
            try:
                self.funcol[id(out)] = (weakref.ref(out), row)
            except TypeError:
                self.complete(row, t_ret)
        return row

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
            gid = self._dicts.group(",".join(map(str, ranks)) if ranks else f"?{key}")
            cached = self._groups[key] = (gid, ranks)
        return cached

    # ------------------------------------------------------------------ c10d works
    def _track_work(self, work, row) -> None:
        """Completion of a c10d collective: its future's callback, else the end of its wait()."""
        try:
            if isinstance(work, torch.ScriptObject):
                work = torch._C._distributed_c10d.Work.unbox(work)
        except Exception:
            self.complete(row, row[COL.t_ret])
            return
        # NOTE: gloo's send/recv works have no future, and waiting on them from a second thread
        # deadlocks; their completion is taken at the end of the caller's own wait() (patched).
        self.works[id(work)] = (work, row)
        try:
            fut = work.get_future()
        except Exception:
            return
        fut.add_done_callback(lambda f, row=row, key=id(work): self._future_done(f, row, key))

    def _future_done(self, fut, row, key) -> None:
        t = _now()
        self.works.pop(key, None)
        try:
            fut.value()
        except Exception as exc:   # e.g. a peer died: the collective never completed
            self._failed(row, exc)
            return
        self.complete(row, t)

    def work_waited(self, work) -> None:
        """Called at the end of every ``Work.wait()`` (process_group.py patches it)."""
        if not self.works:
            return
        item = self.works.pop(id(work), None)
        if item is not None and item[0] is work:
            self.complete(item[1], _now())

    def _failed(self, row, exc) -> None:
        """A collective that ended in an error keeps no end time; the error goes to the meta."""
        with self.lock:
            cid = row[COL.cid]
            if self.pending.pop(cid, None) is None:
                return
            self._flushed_pending.discard(cid)
            failure = self.describe(row)
            first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            failure["error"] = f"{type(exc).__name__}: {first_line}"[:500]
            self.failed.append(failure)

    # ------------------------------------------------------------------ completion
    def complete(self, row, t) -> None:
        with self.lock:
            cid = row[COL.cid]
            if self.pending.pop(cid, None) is None:
                return
            if cid in self._flushed_pending:
                self._flushed_pending.discard(cid)
                self._emit(make_row(t0=t, t1=t, op=self._dicts.op(ops.OP_COMPLETE),
                                    phase=row[COL.phase], step=row[COL.step],
                                    thread=row[COL.thread], cid=cid))
            else:
                row[COL.t1] = t

    def await_async_args(self, args) -> None:
        """An op about to consume an AsyncCollectiveTensor waits for it first: time that wait."""
        for a in args:
            if type(a).__name__ != "AsyncCollectiveTensor":
                continue
            row = self.funcol_take(a)
            if row is not None:
                a.trigger_wait()
                self.complete(row, _now())

    def funcol_take(self, tensor):
        """The pending functional collective whose output ``tensor`` is (or wraps), or None."""
        target = getattr(tensor, "elem", tensor) \
            if type(tensor).__name__ == "AsyncCollectiveTensor" else tensor
        item = self.funcol.get(id(target))
        if item is None or item[0]() is not target:
            return None
        del self.funcol[id(target)]
        return item[1]

    def freeze(self, rows: list) -> None:
        """Before ``rows`` are written: pending rows become tuples; those still incomplete get
        a completion row later. Call with :attr:`lock` held."""
        for i, row in enumerate(rows):
            if type(row) is list:
                if row[COL.t1] is None:
                    self._flushed_pending.add(row[COL.cid])
                rows[i] = tuple(row)

    # ------------------------------------------------------------------ descriptions
    def describe(self, row) -> dict:
        """A collective as the status file and the trace's metadata describe it."""
        return {"kind": self._dicts.kind.values[row[COL.kind]],
                "group": self._dicts.group.values[row[COL.group]], "seq": row[COL.seq],
                "peer": row[COL.peer], "bytes": row[COL.bytes], "t0": row[COL.t0],
                "step": row[COL.step]}

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
