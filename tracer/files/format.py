"""The trace file: an Arrow IPC stream per rank, written while the run goes on.

Layout (the exact schema is documented in docs/trace-format.md):

- one Arrow IPC *stream* (not the random-access file format), so it can be appended batch by
  batch and read back up to the last complete batch after a crash;
- every string column is dictionary-encoded; the tracer's interners only grow, so every batch's
  dictionary extends the previous one and the writer emits dictionary *deltas*: each unique
  stack, module path, op name or annotation is written once;
- buffers are zstd-compressed;
- metadata: the schema carries the format name and version and the metadata known at start;
  any batch may carry more (``paratrace.meta`` custom metadata: clock estimates, config, the
  final status). Readers merge them in order.

Nothing here uses pickle: a trace file from someone else is data, never code.
"""
from __future__ import annotations

import json
import os
from collections import namedtuple
from typing import Any, Optional

import numpy as np
import pyarrow as pa

from ..vocab.strenum import StrEnum
from .rundir import not_regular

FORMAT_NAME = "paratrace.trace"
FORMAT_VERSION = 4     # 2: phases 3-5 (recompute, grad_sync, optimizer); 3: a group may
#                        name its process group (0,1@2), and P2P has sequence numbers apart;
#                        4: memory rows and MEMORY_COLUMNS (only a trace recorded with memory)
NO_MEMORY_VERSION = 3  # what a trace without memory columns is written as: older readers read it
META_KEY = b"paratrace.meta"


def _dict(index_type: Any) -> Any:
    return pa.dictionary(index_type, pa.string())


# (name, arrow type). Rows are tuples in this order. The hot path builds its rows positionally
# (session.OP_ROW and comm.COMM_ROW name their fields; a test checks them against this); every
# other row is built by name with make_row().
COLUMNS = (
    ("t0", pa.int64()),              # start, ns, this rank's monotonic clock
    ("t1", pa.int64()),              # end; for communication the completion (null: never seen)
    ("op", _dict(pa.int32())),       # op overload, e.g. aten.mm.default
    ("phase", pa.int8()),            # index into tracer.vocab.labels.PHASES
    ("module", _dict(pa.int32())),   # nn.Module path, forward module for backward ops
    ("stack", _dict(pa.int32())),    # interned Python stack where the op was issued (JSON)
    ("fwd_stack", _dict(pa.int32())),  # backward ops: stack of the forward op that made the node
    ("annotation", _dict(pa.int32())),  # JSON list of enclosing annotations, outermost first
    ("step", pa.int32()),
    ("thread", pa.int16()),
    ("shapes", _dict(pa.int32())),   # input tensor dtypes and shapes, e.g. "f32[4,8] f32[8,8]"
    ("kind", _dict(pa.int8())),      # communication kind (all_reduce, send, ...), else null
    ("group", _dict(pa.int32())),    # global ranks of the process group, "0,1"
    ("peer", pa.int32()),            # global rank of the peer (P2P) or root
    ("bytes", pa.int64()),           # bytes this rank hands to the collective
    ("dtype", _dict(pa.int8())),
    ("async_op", pa.bool_()),
    ("seq", pa.int32()),             # per-group sequence number of the collective on this rank
    ("cid", pa.int32()),             # communication id: links completions and waits
    ("t_ret", pa.int64()),           # when the launching call returned (async collectives)
)
COLUMN_NAMES = tuple(name for name, _ in COLUMNS)
NCOLS = len(COLUMNS)
DICT_COLUMNS = tuple(name for name, typ in COLUMNS if pa.types.is_dictionary(typ))
SCHEMA = pa.schema([pa.field(name, typ) for name, typ in COLUMNS])
# Memory recording (``tracer.trace(memory=True)``, version 4): these columns follow COLUMNS in
# the file, and each memory event is a row of its own whose ``mem_kind`` is not null (its
# ``t0``, ``bytes``, ``thread`` and ``step`` say when, how much, and for an allocation by an op
# which op: the row of the same thread and ``t0``). The reader splits them off (Trace.memory);
# op rows have them null. docs/trace-format.md, "Memory".
MEMORY_COLUMNS = (
    ("mem_kind", pa.int8()),         # index into MEMORY_KINDS; null on op rows
    ("mem_storage", pa.int32()),     # small storage id, unique per allocation in the file
    ("mem_category", pa.int8()),     # index into MEMORY_CATEGORIES
)


class MemoryKind(StrEnum):
    """What a memory row records of a storage."""

    ALLOC = "alloc"
    FREE = "free"
    RECLASS = "reclass"          # its category moved on


class MemoryCategory(StrEnum):
    """What a storage is kept for; a reclass only ever moves a storage to a later member (the
    recorder's rules: tracer/recorder/memory/memory_recorder.py)."""

    TEMPORARIES = "temporaries"
    COMM = "comm"
    ACTIVATIONS = "activations"
    OPTIMIZER_STATE = "optimizer_state"
    GRADIENTS = "gradients"
    PARAMETERS = "parameters"


# NOTE: the codes traces store (mem_kind, mem_category index these): append, never reorder
MEMORY_KINDS: tuple[MemoryKind, ...] = tuple(MemoryKind)
MEMORY_CATEGORIES: tuple[MemoryCategory, ...] = tuple(MemoryCategory)
MEMORY_SCHEMA = pa.schema([pa.field(name, typ) for name, typ in COLUMNS + MEMORY_COLUMNS])
# Each column's index in a row, by name: ``row[COL.cid]``.
COL = namedtuple("ColumnIndex", COLUMN_NAMES)(*range(NCOLS))
_INDEX = {name: i for i, name in enumerate(COLUMN_NAMES)}


def make_row(**values: Any) -> tuple[Any, ...]:
    """A full row from column values given by name; the columns not given are null."""
    row = [None] * NCOLS
    for name, value in values.items():
        try:
            row[_INDEX[name]] = value
        except KeyError:
            raise TypeError(f"make_row: no trace column named {name!r}") from None
    return tuple(row)


class TraceError(Exception):
    """A trace file that cannot be read; the message names the file and the problem."""


def write_options(dictionary_deltas: bool) -> pa.ipc.IpcWriteOptions:
    """zstd, compressed on the writing thread (the flusher's).

    NOTE: not on Arrow's thread pool (``use_threads=True``, its default): a batch has about 40
    buffers of a few KB, and handing each to the pool cost more than compressing it: a
    1,339-row batch took 0.76 ms of the process's CPU through the pool, 0.40 ms on the writing
    thread (benchmarks/trace_write.py, docs/overhead.md). The write releases the GIL either
    way."""
    return pa.ipc.IpcWriteOptions(compression="zstd", use_threads=False,
                                  emit_dictionary_deltas=dictionary_deltas)


class TraceWriter:
    """Appends batches of rows to one rank's stream. Not thread-safe: one flusher writes."""

    def __init__(self, path: str, meta: dict[str, Any], memory: Optional[bool] = None):
        """``memory``: write MEMORY_COLUMNS (version 4); None: as ``meta``'s options say."""
        self.path = path
        if memory is None:
            memory = bool((meta.get("options") or {}).get("memory"))
        self.memory = memory
        self.schema = MEMORY_SCHEMA if memory else SCHEMA
        self._columns = COLUMNS + MEMORY_COLUMNS if memory else COLUMNS
        version = FORMAT_VERSION if memory else min(FORMAT_VERSION, NO_MEMORY_VERSION)
        metadata = {b"paratrace.format": FORMAT_NAME.encode(),
                    b"paratrace.version": str(version).encode(),
                    META_KEY: json.dumps(meta).encode()}
        self._sink = pa.OSFile(path, "wb")
        self._writer = pa.ipc.new_stream(self._sink, self.schema.with_metadata(metadata),
                                         options=write_options(dictionary_deltas=True))
        # column -> (its value list, that list as Arrow)
        self._dictionaries: dict[str, tuple[list[str], Any]] = {}
        self.events = 0                    # op rows written (the status file's events)

    def write(self, rows: list[tuple[Any, ...]], dictionaries: dict[str, list[str]],
              meta: Optional[dict[str, Any]] = None) -> None:
        """Write rows (tuples in COLUMNS order, shorter rows padded with nulls).

        ``dictionaries`` maps each dictionary column to its interner's full value list; rows hold
        indices into them.
        """
        if rows:
            cols = list(zip(*[r if len(r) == NCOLS else tuple(r) + _PAD[len(r)] for r in rows]))
        else:
            cols = [()] * NCOLS
        arrays = {}
        for (name, typ), col in zip(COLUMNS, cols):
            arrays[name] = pa.array(col, type=typ.index_type if pa.types.is_dictionary(typ)
                                    else typ)
        self.write_arrays(arrays, len(rows), dictionaries, meta)

    def write_arrays(self, arrays: dict[str, Any], n: int, dictionaries: dict[str, list[str]],
                     meta: Optional[dict[str, Any]] = None) -> None:
        """Write one batch of ``n`` rows given as column name -> pyarrow array (the indices for
        dictionary columns); a column left out is null."""
        columns = []
        for name, typ in self._columns:
            array = arrays.get(name)
            if pa.types.is_dictionary(typ):
                if array is None:
                    array = pa.nulls(n, typ.index_type)
                array = pa.DictionaryArray.from_arrays(array, self._dictionary(name,
                                                                               dictionaries))
            elif array is None:
                array = pa.nulls(n, typ)
            columns.append(array)
        batch = pa.RecordBatch.from_arrays(columns, schema=self.schema)
        custom = {META_KEY: json.dumps(meta).encode()} if meta else None
        self._writer.write_batch(batch, custom_metadata=custom)
        if arrays.get("mem_kind") is None:  # not the memory recorder's batch of memory rows
            self.events += n

    def _dictionary(self, name: str, dictionaries: dict[str, list[str]]) -> pa.Array:
        """A column's dictionary as an Arrow array, converting only the values it gained (they
        only grow) since the last batch."""
        values = dictionaries[name]
        source: Optional[list[str]]
        cached: Any                      # None before the first batch (source is None then)
        source, cached = self._dictionaries.get(name, (None, None))
        if source is not values or len(cached) > len(values):
            cached = pa.array(values, type=pa.string())      # another list: convert it all
        elif len(cached) < len(values):
            cached = pa.concat_arrays([cached, pa.array(values[len(cached):],
                                                        type=pa.string())])
        self._dictionaries[name] = (values, cached)
        return cached

    def write_columns(self, columns: dict[str, Any], dictionaries: dict[str, list[str]],
                      meta: Optional[dict[str, Any]] = None) -> None:
        """Write one batch given column by column: numpy int arrays (dictionary columns hold
        codes), -1 standing for null as the reader gives it back; absent columns are null.
        For constructed traces (constructed.synthetic); the recorder writes rows."""
        n = len(next(iter(columns.values()))) if columns else 0
        arrays = []
        for name, typ in self._columns:
            values = columns.get(name)
            if values is None:
                values = np.full(n, -1, dtype=np.int64)
            values = np.asarray(values)
            mask = values == -1
            if pa.types.is_dictionary(typ):
                arrays.append(pa.DictionaryArray.from_arrays(
                    pa.array(values, mask=mask, type=typ.index_type),
                    pa.array(dictionaries[name], type=pa.string())))
            elif pa.types.is_boolean(typ):
                arrays.append(pa.array(values > 0, mask=mask, type=typ))
            else:
                arrays.append(pa.array(values, mask=mask, type=typ))
        batch = pa.RecordBatch.from_arrays(arrays, schema=self.schema)
        custom = {META_KEY: json.dumps(meta).encode()} if meta else None
        self._writer.write_batch(batch, custom_metadata=custom)
        self.events += n

    def close(self) -> None:
        self._writer.close()
        self._sink.close()


_PAD = {n: (None,) * (NCOLS - n) for n in range(NCOLS + 1)}


def rename(writer: TraceWriter, new_path: str) -> None:
    """Move an open trace file (POSIX keeps the open descriptor valid)."""
    os.replace(writer.path, new_path)
    writer.path = new_path


def read_stream(path: str
                ) -> tuple[dict[str, Any], Any, list[Any], list[Any], Optional[str]]:
    """Read a trace file: (the metadata it started with, its Arrow schema, list of batches, list
    of batch metas, problem).

    ``problem`` is None for an intact file, else a one-line description of where reading stopped
    (a truncated or corrupt tail); everything before that point is returned.
    Raises TraceError for a file that is not a readable paratrace trace at all.
    """
    if not os.path.exists(path):
        raise TraceError(f"{path}: no such trace file")
    kind = not_regular(path)
    if kind:
        raise TraceError(f"{path}: {kind}, not a trace file")
    if os.path.getsize(path) == 0:
        raise TraceError(f"{path}: empty file (0 bytes): the rank wrote nothing")
    try:
        source = pa.memory_map(path, "r")
        reader = pa.ipc.open_stream(source)
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as exc:
        raise TraceError(f"{path}: not a paratrace trace file ({_short(exc)})") from None
    schema_meta = reader.schema.metadata or {}
    if schema_meta.get(b"paratrace.format") != FORMAT_NAME.encode():
        raise TraceError(f"{path}: not a paratrace trace file (an Arrow stream of another kind)")
    try:
        version = int(schema_meta.get(b"paratrace.version", b"0"))
    except ValueError:
        raise TraceError(f"{path}: corrupt trace header (bad version field)") from None
    if version > FORMAT_VERSION:
        raise TraceError(f"{path}: trace format version {version} is newer than this paratrace "
                         f"reads (up to {FORMAT_VERSION}); upgrade paratrace")
    try:
        start_meta = json.loads(schema_meta.get(META_KEY, b"{}"))
    except ValueError:
        raise TraceError(f"{path}: corrupt trace header (metadata is not JSON)") from None
    missing = [n for n in COLUMN_NAMES if n not in reader.schema.names]
    if missing:
        raise TraceError(f"{path}: trace schema lacks columns {', '.join(missing)}")
    batches: list[Any] = []
    metas: list[Any] = []
    problem: Optional[str] = None
    while True:
        try:
            batch, custom = reader.read_next_batch_with_custom_metadata()
        except StopIteration:
            break
        except (pa.ArrowInvalid, pa.ArrowIOError, OSError, ValueError) as exc:
            problem = f"truncated or corrupt after {sum(len(b) for b in batches):,} events " \
                      f"({_short(exc)})"
            break
        batches.append(batch)
        if custom and META_KEY in custom:
            try:
                metas.append(json.loads(custom[META_KEY]))
            except ValueError:
                problem = "corrupt batch metadata ignored"
    return start_meta, reader.schema, batches, metas, problem


def _short(exc: Exception) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text[:160]


def decode_stack(text: str) -> tuple[tuple[Any, ...], ...]:
    """A ``stack`` column's JSON text -> tuple of (file, line, function, qualname), innermost
    first."""
    return tuple(tuple(frame) for frame in json.loads(text))
