"""One rank's trace as the timeline reads it: its columns on rank 0's clock (``Trace.global_times``)
and which rows are what (real ops, compute, communication, annotation ranges, step markers).
:mod:`.rank_lanes` builds the rank's lanes from them; :mod:`.passes` and :mod:`.phase_time`
read them too.
"""
from __future__ import annotations

import numpy as np

from tracer.files.reader import Trace
from tracer.vocab import ops as _ops

_WAIT_OPS = ("_c10d_functional.wait_tensor.default", "c10d_functional.wait_tensor.default")


class RankRows:
    """One trace's columns on the global clock, and which rows are what."""

    def __init__(self, trace: Trace, rank: int) -> None:
        self.trace = trace
        self.rank = rank          # the run's key (the file's rank), whatever the metadata says
        self.t0, self.t1 = trace.global_times()
        t_ret = trace.col("t_ret")
        self.t_ret = np.where(t_ret >= 0, t_ret + trace.clock_offset(np.maximum(t_ret, 0)), -1)
        self.op = trace.col("op")
        self.kind = trace.col("kind")
        self.step = trace.col("step")
        self.thread = trace.col("thread")
        self.annotation = trace.col("annotation")
        self.peer = trace.col("peer")
        self.group = trace.col("group")
        names = trace.dictionary("op")
        self.op_names = names
        code = {name: i for i, name in enumerate(names)}
        self.ann_code = code.get(_ops.OP_ANNOTATION, -2)
        self.step_code = code.get(_ops.OP_STEP, -2)
        pseudo = [code[n] for n in _ops.PSEUDO_OPS if n in code]
        waits = [code[n] for n in _WAIT_OPS if n in code]
        self.real = ~np.isin(self.op, pseudo)
        self.is_comm = self.kind >= 0
        self.is_compute = self.real & ~self.is_comm & ~np.isin(self.op, waits) & (self.t1 >= 0)
        self.kinds = trace.dictionary("kind")
        self.groups = trace.dictionary("group")

    def group_of(self, i: int) -> str:
        return self.groups[self.group[i]] if self.group[i] >= 0 else ""
