"""The reference GPT's recorded activations per transformer block and micro-batch, read from
a memory trace's raw events (tracer.files.reader.Trace.memory) without
viz.analysis.memory.live_bytes, so tests can hold them against Korthikanti et al.'s counts and the
pipeline schedules' in-flight micro-batches (docs/oracles.md, "Memory per rank").

A storage's category is the last it was given (a reclass only moves it to a later entry of
tracer.files.format.MEMORY_CATEGORIES); a block pass is the ``GPTChunk.blocks.<i>`` module and the ``F``
annotation's micro-batch of the op that allocated it.
"""
from __future__ import annotations

import json
import re
from collections import Counter

import numpy as np

import tracer
from tracer.files import rundir
from tracer.files.format import MEMORY_CATEGORIES, MEMORY_KINDS

ALLOC, FREE = MEMORY_KINDS.index("alloc"), MEMORY_KINDS.index("free")
ACTIVATIONS = MEMORY_CATEGORIES.index("activations")
_BLOCK = re.compile(r"GPTChunk\.blocks\.(\d+)")


class _Events:
    def __init__(self, out, rank: int):
        trace = tracer.load(rundir.trace_file(str(out / "traces"), rank))
        ev = trace.memory
        order = np.argsort(np.asarray(ev.t), kind="stable")
        self.kind, self.storage, self.bytes, self.category, self.row, self.step = (
            np.asarray(getattr(ev, k))[order]
            for k in ("kind", "storage", "bytes", "category", "row", "step"))
        self.final: dict = {}
        for k, s, c in zip(self.kind.tolist(), self.storage.tolist(), self.category.tolist()):
            if k != FREE:
                self.final[s] = max(self.final.get(s, 0), c)
        self._modules, self._module = trace.dictionary("module"), trace.col("module")
        self._notes, self._note = trace.dictionary("annotation"), trace.col("annotation")

    def block_pass(self, row: int):
        """(block index, micro-batch) of the forward op at ``row``, or None."""
        if row < 0 or self._module[row] < 0 or self._note[row] < 0:
            return None
        block = _BLOCK.match(self._modules[self._module[row]])
        forward = [a for a in json.loads(self._notes[self._note[row]]) if a.get("label") == "F"]
        if block is None or not forward:
            return None
        return int(block.group(1)), forward[0]["microbatch"]


def activations_per_block_pass(out, rank: int, step: int) -> Counter:
    """(block, micro-batch) -> bytes of activations its forward allocated in ``step``."""
    ev = _Events(out, rank)
    kept: Counter = Counter()
    for k, s, b, r, st in zip(ev.kind.tolist(), ev.storage.tolist(), ev.bytes.tolist(),
                              ev.row.tolist(), ev.step.tolist()):
        if k == ALLOC and st == step and ev.final[s] == ACTIVATIONS:
            where = ev.block_pass(r)
            if where is not None:
                kept[where] += b
    return kept


def activations_at_their_peak(out, rank: int, step: int) -> Counter:
    """(block, micro-batch) -> bytes of its activations live when the rank's activations
    (those allocated in ``step``) peaked."""
    ev = _Events(out, rank)
    alive: dict = {}
    live, best, snapshot = 0, -1, {}
    for k, s, b, r, st in zip(ev.kind.tolist(), ev.storage.tolist(), ev.bytes.tolist(),
                              ev.row.tolist(), ev.step.tolist()):
        if ev.final[s] != ACTIVATIONS:
            continue
        if k == ALLOC and st == step:
            alive[s] = (r, b)
            live += b
        elif k == FREE and s in alive:
            live -= alive.pop(s)[1]
        else:
            continue
        if live > best:
            best, snapshot = live, dict(alive)
    held: Counter = Counter()
    for r, b in snapshot.values():
        where = ev.block_pass(r)
        if where is not None:
            held[where] += b
    return held
