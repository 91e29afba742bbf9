"""Loading a trace file into a :class:`Trace` that viz/ analyses read.

A Trace holds the events as one pyarrow Table (dictionary columns unified into one chunk, so
DuckDB / Polars can take it as is) and numpy views of its columns for fast analyses. Completion
rows the tracer wrote for collectives flushed before they finished are folded back into their
collectives' ``t1`` and dropped. A truncated or corrupt tail is cut off with a warning; what came
before it is kept.
"""
from __future__ import annotations

import json
from typing import Any, NamedTuple, Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracer.vocab import ops
from tracer.vocab.groups import group_ranks
from tracer.vocab.labels import PHASES

from .format import COLUMNS, DICT_COLUMNS, MEMORY_COLUMNS, SCHEMA, decode_stack, read_stream

_META_MERGE_DICTS = ("config", "sources", "process_groups")


class MemoryEvents(NamedTuple):
    """A trace's memory rows (docs/trace-format.md, "Memory"), in file order, as int64 numpy
    arrays; -1 where null. ``kind`` and ``category`` index tracer.files.format's MEMORY_KINDS and
    MEMORY_CATEGORIES; ``row``: the row of :attr:`Trace.table` of the op an allocation came out
    of (-1: a storage found alive by a walk, a free, a reclass)."""

    kind: np.ndarray
    storage: np.ndarray
    bytes: np.ndarray
    t: np.ndarray
    category: np.ndarray
    thread: np.ndarray
    step: np.ndarray
    row: np.ndarray

    def __len__(self) -> int:
        return len(self.kind)


class Trace:
    """One rank's recording. Columns: see docs/trace-format.md. ``memory``: its MemoryEvents,
    or None when memory was not recorded."""

    def __init__(self, path: str, table: pa.Table, meta: dict[str, Any], warnings: list[str],
                 complete: bool,
                 memory: Optional[MemoryEvents] = None):
        self.path = path
        self.table = table
        self.memory = memory
        self.meta = meta
        self.warnings = warnings
        self.complete = complete
        self._cols: dict[str, np.ndarray] = {}
        self._dicts: dict[str, list[str]] = {}             # column -> its strings, decoded once
        self._indexes: dict[str, dict[str, int]] = {}      # column -> {string: code}
        self._stacks: dict[int, tuple[tuple[Any, ...], ...]] = {}   # code -> decoded frames
        self._annotations: dict[int, tuple[dict[str, Any], ...]] = {}   # code -> decoded dicts

    # ---------------------------------------------------------------- identity
    @property
    def rank(self) -> int:
        return int(self.meta.get("rank", 0))

    @property
    def world_size(self) -> int:
        return int(self.meta.get("world_size", 1))

    @property
    def status(self) -> str:
        """ok | failed | interrupted | running (the writer never closed: killed or still going)."""
        return self.meta.get("status", "running")

    @property
    def config(self) -> dict[str, Any]:
        return self.meta.get("config") or {}

    def __len__(self) -> int:
        return self.table.num_rows

    def select(self, mask: Any) -> Trace:
        """The same trace (metadata, dictionaries, codes) with only the rows where ``mask``
        (a boolean array over the events) is true; without its memory events (their rows
        would point elsewhere)."""
        return Trace(self.path, self.table.filter(pa.array(np.asarray(mask, dtype=bool))),
                     self.meta, self.warnings, self.complete)

    # ---------------------------------------------------------------- columns
    def col(self, name: str) -> np.ndarray:
        """numpy view of a column; dictionary columns give int codes; null -> -1."""
        arr = self._cols.get(name)
        if arr is None:
            column = self.table.column(name)
            if pa.types.is_dictionary(column.type):
                column = column.combine_chunks()
                arr = pc.fill_null(column.indices, -1).to_numpy(zero_copy_only=False) \
                    .astype(np.int64)
            elif pa.types.is_boolean(column.type):
                arr = pc.fill_null(pc.cast(column, pa.int8()), -1).to_numpy().astype(np.int8)
            else:
                arr = pc.fill_null(column, -1).to_numpy()
            self._cols[name] = arr
        return arr

    def dictionary(self, name: str) -> list[str]:
        """The string values a dictionary column's codes index (decoded once; do not mutate)."""
        values = self._dicts.get(name)
        if values is None:
            column = self.table.column(name)
            values = column.chunk(0).dictionary.to_pylist() if column.num_chunks else []
            self._dicts[name] = values
        return values

    def code(self, name: str, value: str) -> int:
        """The code of a string in a dictionary column, or -1."""
        index = self._indexes.get(name)
        if index is None:
            index = self._indexes[name] = {v: i for i, v in enumerate(self.dictionary(name))}
        return index.get(value, -1)

    def stack(self, code: int) -> tuple[tuple[Any, ...], ...]:
        """Frames (file, line, function, qualname) of a stack code, innermost first."""
        if code < 0:
            return ()
        frames = self._stacks.get(code)
        if frames is None:
            frames = self._stacks[code] = decode_stack(self.dictionary("stack")[code])
        return frames

    def annotation(self, code: int) -> tuple[dict[str, Any], ...]:
        """Enclosing annotations of an annotation code, outermost first, as dicts."""
        if code < 0:
            return ()
        entries = self._annotations.get(code)
        if entries is None:
            entries = self._annotations[code] = tuple(
                json.loads(self.dictionary("annotation")[code]))
        return entries

    # ---------------------------------------------------------------- clocks
    def clock_offset(self, t_ns: Any) -> np.ndarray:
        """Offset to add to local times to get rank 0's clock (linear between the estimates)."""
        start, end = self.meta.get("clock_start"), self.meta.get("clock_end")
        t = np.asarray(t_ns, dtype=np.int64)
        if not start:
            return np.zeros_like(t)
        if not end or end["at_ns"] == start["at_ns"]:
            return np.full_like(t, int(start["offset_ns"]))
        slope = (end["offset_ns"] - start["offset_ns"]) / (end["at_ns"] - start["at_ns"])
        return (start["offset_ns"] + slope * (t - start["at_ns"])).astype(np.int64)

    @property
    def clock_error_ns(self) -> Optional[int]:
        """Bound on the alignment error to rank 0, or None when the clock was not aligned."""
        errors = [c["error_ns"] for c in (self.meta.get("clock_start"), self.meta.get("clock_end"))
                  if c]
        return max(errors) if errors else None

    def global_times(self) -> tuple[np.ndarray, np.ndarray]:
        """(t0, t1) on rank 0's clock; t1 is -1 where a collective never completed."""
        t0, t1 = self.col("t0"), self.col("t1")
        g0 = t0 + self.clock_offset(t0)
        g1 = np.where(t1 >= 0, t1 + self.clock_offset(np.maximum(t1, 0)), -1)
        return g0, g1

    # ---------------------------------------------------------------- convenience
    def records(self) -> list[dict[str, Any]]:
        """Every event as a dict with decoded strings (slow; for tests and small traces)."""
        out = []
        names = {n: self.dictionary(n) for n in DICT_COLUMNS}
        cols = {n: self.col(n) for n, _ in COLUMNS}
        for i in range(len(self)):
            rec: dict[str, Any] = {}
            for name, _ in COLUMNS:
                v = int(cols[name][i])
                if name in names:
                    rec[name] = names[name][v] if v >= 0 else None
                else:
                    rec[name] = None if v == -1 and name not in ("t0", "step") else v
            rec["phase"] = PHASES[rec["phase"]].value     # a plain str, as load() gave
            rec["group"] = group_ranks(rec["group"]) or None
            rec["stack"] = self.stack(int(cols["stack"][i]))
            rec["fwd_stack"] = self.stack(int(cols["fwd_stack"][i]))
            rec["annotation"] = list(self.annotation(int(cols["annotation"][i])))
            rec["async_op"] = None if rec["async_op"] is None else bool(rec["async_op"])
            out.append(rec)
        return out

    def __repr__(self) -> str:
        return f"<Trace rank {self.rank}/{self.world_size} {len(self)} events {self.status}>"


def load(path: str) -> Trace:
    """Read one trace file. Raises TraceError (one line naming the file) if unreadable."""
    start_meta, schema, batches, metas, problem = read_stream(str(path))
    meta = dict(start_meta)
    for update in metas:
        for key, value in update.items():
            if key in _META_MERGE_DICTS and isinstance(value, dict):
                meta[key] = dict(meta.get(key) or {}, **value)
            else:
                meta[key] = value
    kept = sum(len(b) for b in batches)
    warnings = [f"{path}: {problem}; those {kept:,} events are used"] if problem else []
    complete = problem is None and "status" in meta
    if "status" not in meta and not problem:
        warnings.append(f"{path}: the recording never closed (rank killed or still running); "
                        f"events up to the last flush are kept")
    table, memory = _unify(batches, schema)
    table = _fold_completions(table)
    return Trace(str(path), table, meta, warnings, complete,
                 _memory_events(memory, table) if memory is not None else None)


def _unify(batches: list[Any], schema: pa.Schema
           ) -> tuple[pa.Table, Optional[dict[str, np.ndarray]]]:
    """(the events: one chunk per column, each dictionary column indexing its last (fullest)
    dictionary; the memory rows' columns, name -> numpy array, or None where the file has no
    memory columns: recorded without memory, or before version 4)."""
    arrays = []
    for name, typ in COLUMNS:
        chunks = [b.column(name) for b in batches]
        if pa.types.is_dictionary(typ):
            dictionary = max((c.dictionary for c in chunks), key=len, default=pa.array(
                [], pa.string()))
            indices = pa.concat_arrays([c.indices for c in chunks]) if chunks else \
                pa.array([], typ.index_type)
            arrays.append(pa.DictionaryArray.from_arrays(indices, dictionary))
        else:
            arrays.append(pa.concat_arrays(chunks) if chunks else pa.array([], typ))
    table = pa.Table.from_arrays(arrays, schema=SCHEMA)
    if schema.get_field_index("mem_kind") < 0:
        return table, None
    kind = pa.concat_arrays([b.column("mem_kind") for b in batches]) if batches else \
        pa.array([], pa.int8())
    is_memory = kind.is_valid().to_numpy(zero_copy_only=False)
    keep = pa.array(is_memory)
    memory = {}
    for name in ("t0", "bytes", "thread", "step") + tuple(n for n, _ in MEMORY_COLUMNS):
        column = table.column(name) if name in SCHEMA.names else pa.chunked_array(
            [b.column(name) for b in batches], type=schema.field(name).type)
        memory[name] = pc.fill_null(column.filter(keep), -1).to_numpy().astype(np.int64)
    return table.filter(pa.array(~is_memory)), memory


def latest_holding(starts: np.ndarray, ends: np.ndarray, times: np.ndarray) -> np.ndarray:
    """Per time, the index of the latest of the intervals [starts, ends] (sorted by start)
    that began at or before it and has not ended before it (the innermost, where they nest),
    else -1."""
    out = np.searchsorted(starts, times, side="right") - 1
    for i, (time, j) in enumerate(zip(times.tolist(), out.tolist())):
        while j >= 0 and ends[j] < time:
            j -= 1
        out[i] = j
    return out


def _memory_events(memory: dict[str, np.ndarray], table: pa.Table) -> MemoryEvents:
    """The memory rows, each allocation by an op linked to that op's row: the op row of the
    same thread with the same ``t0`` (the recorder's), else the innermost op row of that
    thread whose [t0, t1] holds it (an import's, at the allocator's own time); pseudo-op rows
    are never the op."""
    t0 = pc.fill_null(table.column("t0"), -1).to_numpy()
    t1 = pc.fill_null(table.column("t1"), -1).to_numpy()
    thread = pc.fill_null(table.column("thread"), -1).to_numpy()
    op = table.column("op").combine_chunks()
    pseudo = [i for i, name in enumerate(op.dictionary.to_pylist())
              if name.startswith("paratrace::")] if len(op) else []
    real = ~np.isin(pc.fill_null(op.indices, -1).to_numpy(zero_copy_only=False), pseudo) \
        if len(op) else np.zeros(0, bool)
    row = np.full(len(memory["t0"]), -1, dtype=np.int64)
    linked = (memory["mem_kind"] == 0) & (memory["thread"] >= 0)
    for th in np.unique(memory["thread"][linked]).tolist():
        rows = np.flatnonzero(real & (thread == th))
        order = np.argsort(t0[rows], kind="stable")
        times = t0[rows][order]
        if not len(times):
            continue
        which = np.flatnonzero(linked & (memory["thread"] == th))
        pos = np.minimum(np.searchsorted(times, memory["t0"][which]), len(times) - 1)
        found = times[pos] == memory["t0"][which]
        row[which[found]] = rows[order[pos[found]]]
        rest = which[~found]
        held = latest_holding(times, np.maximum(t1[rows][order], times), memory["t0"][rest])
        row[rest[held >= 0]] = rows[order[held[held >= 0]]]
    return MemoryEvents(memory["mem_kind"], memory["mem_storage"], memory["bytes"],
                        memory["t0"], memory["mem_category"], memory["thread"], memory["step"],
                        row)


def _fold_completions(table: pa.Table) -> pa.Table:
    op = table.column("op").chunk(0)
    dictionary = op.dictionary.to_pylist()
    if ops.OP_COMPLETE not in dictionary:
        return table
    code = dictionary.index(ops.OP_COMPLETE)
    codes = pc.fill_null(op.indices, -1).to_numpy(zero_copy_only=False)
    is_done = codes == code
    cid = pc.fill_null(table.column("cid"), -1).to_numpy()
    t1 = pc.fill_null(table.column("t1"), -1).to_numpy().copy()
    done_at = dict(zip(cid[is_done].tolist(), table.column("t0").to_numpy()[is_done].tolist()))
    for i in np.nonzero((~is_done) & (cid >= 0) & (t1 < 0))[0]:
        t = done_at.get(int(cid[i]))
        if t is not None:
            t1[i] = t
    new_t1 = pa.array(np.where(t1 >= 0, t1, 0), mask=t1 < 0, type=pa.int64())
    table = table.set_column(table.schema.get_field_index("t1"), "t1", new_t1)
    return table.filter(pa.array(~is_done))
