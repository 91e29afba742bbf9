"""Constructed traces: trace files with known times, written as the recorder writes them.

Tests of the timing analyses and the benchmarks build their traces here, so every expected
number is exact and no test depends on how loaded the machine was::

    r = SyntheticRank(0, 2, config={"pp": 2, "microbatches": 4, "schedule": "gpipe"})
    r.next_step(0)
    r.annotate("F", 0, 10, microbatch=0, chunk=0)
    r.op(0, 10, stack=[("model.py", 12, "forward", "Block.forward")], module="GPT.blocks.0")
    r.comm("send", 10, 10, 15, peer=1, group=(0, 1))
    r.write("run/traces")              # run/traces/rank-0.arrow, read by tracer.load

Times are in units of ``unit_ns`` (1 us by default) from ``base_ns``. Rows go through
:class:`tracer.files.format.TraceWriter` with the recorder's own columns, dictionaries and
metadata. Torch-free.
"""
from __future__ import annotations

import json
import os
from typing import Optional, Sequence

from tracer.files import rundir
from tracer.files.format import COLUMNS, DICT_COLUMNS, FORMAT_VERSION, TraceWriter
from tracer.vocab import ops
from tracer.vocab.groups import group_text
from tracer.vocab.labels import PHASE_CODES

_INDEX = {name: i for i, (name, _) in enumerate(COLUMNS)}
_C10D_OPS = {"send": "c10d.send.default", "recv": "c10d.recv_.default",
             "all_reduce": "c10d.allreduce_.default", "all_gather": "c10d._allgather_base_.default",
             "reduce_scatter": "c10d._reduce_scatter_base_.default",
             "broadcast": "c10d.broadcast_.default", "all_to_all": "c10d.alltoall_base_.default",
             "barrier": "c10d.barrier.default"}


class SyntheticRank:
    """The rows of one rank's trace, built call by call."""

    def __init__(self, rank: int, world: int, config: Optional[dict] = None, *,
                 unit_ns: int = 1_000, base_ns: int = 1_000_000_000, meta: Optional[dict] = None):
        self.rank, self.world, self.config = rank, world, dict(config or {})
        self.unit_ns, self.base_ns = unit_ns, base_ns
        self.meta = dict(meta or {})
        self.rows: list = []
        self.dicts: dict = {name: [] for name in DICT_COLUMNS}
        self._ids: dict = {name: {} for name in DICT_COLUMNS}
        self.step = 0
        self._seq: dict = {}
        self._cid = 0

    # ------------------------------------------------------------------ building
    def t(self, units: float) -> int:
        """A time in units as the trace's nanoseconds."""
        return self.base_ns + int(round(units * self.unit_ns))

    def _code(self, column: str, value) -> Optional[int]:
        if value is None:
            return None
        ids = self._ids[column]
        code = ids.get(value)
        if code is None:
            code = ids[value] = len(self.dicts[column])
            self.dicts[column].append(value)
        return code

    def row(self, **fields) -> None:
        """Append one row; strings of dictionary columns are interned, others taken as is."""
        out = [None] * len(COLUMNS)
        for name, value in fields.items():
            out[_INDEX[name]] = self._code(name, value) if name in DICT_COLUMNS else value
        if out[_INDEX["step"]] is None:
            out[_INDEX["step"]] = self.step
        out[_INDEX["thread"]] = out[_INDEX["thread"]] or 0
        out[_INDEX["phase"]] = out[_INDEX["phase"]] or 0
        self.rows.append(tuple(out))

    def op(self, t0: float, t1: float, name: str = "aten.mm.default", phase="forward",
           thread: int = 0, stack: Optional[Sequence] = None, module: Optional[str] = None,
           shapes: Optional[str] = None, fwd_stack: Optional[Sequence] = None,
           annotation: Optional[list] = None) -> None:
        """An aten op. ``stack``: frames (file, line, function, qualname), innermost first;
        ``phase``: a name of tracer.vocab.labels.PHASES or its code."""
        self.row(t0=self.t(t0), t1=self.t(t1), op=name, phase=_phase(phase), thread=thread,
                 stack=_stack(stack), fwd_stack=_stack(fwd_stack), module=module, shapes=shapes,
                 annotation=_annotation(annotation))

    def comm(self, kind: str, t0: float, t_ret: float, t1: Optional[float], *,
             peer: Optional[int] = None, group: Sequence[int] = (0, 1), nbytes: int = 1024,
             op: Optional[str] = None, phase="other", dtype: str = "f32",
             stack: Optional[Sequence] = None, module: Optional[str] = None,
             thread: int = 0, seq: Optional[int] = None) -> None:
        """A collective or P2P op launched at ``t0``, returning at ``t_ret`` and completed at
        ``t1`` (None: never completed). Its per-group sequence number counts up per group,
        apart for collectives and for send/recv as the recorder counts (``seq``: this one
        instead, as a rank that skipped collectives would record). ``group``: ranks, or the
        trace's text of the group (``"0,1@2"``)."""
        text = group if isinstance(group, str) else group_text(tuple(group))
        counter = (text, kind in ("send", "recv"))
        seq = self._seq.get(counter, 0) if seq is None else seq
        self._seq[counter] = seq + 1
        self.row(t0=self.t(t0), t_ret=self.t(t_ret), t1=None if t1 is None else self.t(t1),
                 op=op or _C10D_OPS.get(kind, f"c10d.{kind}.default"), kind=kind, group=text,
                 peer=peer, bytes=nbytes, dtype=dtype, seq=seq, cid=self._cid,
                 phase=_phase(phase), stack=_stack(stack), module=module, thread=thread,
                 async_op=False)
        self._cid += 1

    def annotate(self, label: str, t0: float, t1: float, *, outer: Sequence[dict] = (),
                 thread: int = 0, stack: Optional[Sequence] = None,
                 row_module: Optional[str] = None, **attrs) -> None:
        """A closed annotation range (``tracer.annotate``), inside the ``outer`` ones, closed
        on ``thread``; ``stack`` and ``row_module``: the row's own stack and module, which the
        recorder writes for a higher-order operator's range (``attrs`` may hold a ``module``
        attribute of their own, as a ``torch.compile`` range's do)."""
        self.row(t0=self.t(t0), t1=self.t(t1), op=ops.OP_ANNOTATION, thread=thread,
                 stack=_stack(stack), module=row_module,
                 annotation=_annotation(list(outer) + [dict(label=label, **attrs)]))

    def next_step(self, t: float) -> None:
        """A step boundary at ``t``."""
        self.step += 1
        self.row(t0=self.t(t), t1=self.t(t), op=ops.OP_STEP)

    # ------------------------------------------------------------------ writing
    def write(self, directory, *, status: Optional[str] = "ok",
              batch_rows: Optional[int] = None) -> str:
        """Write ``directory/rank-<R>.arrow`` in completion order, as the recorder flushes;
        ``batch_rows`` splits it into batches of that many rows; ``status=None`` leaves the
        recording unclosed, as a killed rank does. Returns its path."""
        os.makedirs(str(directory), exist_ok=True)
        path = rundir.trace_file(str(directory), self.rank)
        meta = {"format_version": FORMAT_VERSION, "rank": self.rank, "world_size": self.world,
                "start_ns": self.base_ns, **self.meta}
        writer = TraceWriter(path, meta)
        end = _INDEX["t1"], _INDEX["t0"]
        rows = sorted(self.rows, key=lambda r: r[end[0]] if r[end[0]] is not None else r[end[1]])
        size = batch_rows or max(len(rows), 1)
        for i in range(0, max(len(rows), 1), size):
            writer.write(rows[i:i + size], self.dicts)
        final = {"config": self.config}
        if status is not None:
            final["status"] = status
        writer.write([], self.dicts, final)
        writer.close()
        return path


def write_run(directory, ranks: Sequence[SyntheticRank], **kwargs) -> str:
    """Write every rank's trace into ``directory`` (created); returns the directory."""
    for r in ranks:
        r.write(directory, **kwargs)
    return str(directory)


def _phase(phase) -> int:
    return phase if isinstance(phase, int) else PHASE_CODES[phase]


def _stack(frames: Optional[Sequence]) -> Optional[str]:
    if frames is None:
        return None
    return json.dumps([list(f) for f in frames], separators=(",", ":"))


def _annotation(entries: Optional[list]) -> Optional[str]:
    if not entries:
        return None
    return json.dumps(entries, separators=(",", ":"), default=str)
