"""The recorder's rows in memory: one packed record per event until the flusher turns a run of
them into Arrow columns.

A record is ``RECORD`` (twelve int64: the hot path's columns, OP_ROW, then ``cid``), with -1 for
null. Packed bytes are not objects the garbage collector tracks, so holding a quarter second of
events costs it nothing (tuples, tracked until a collection untracks them, made the collector
run ten times as often), and the flusher reads a run of records with numpy instead of
transposing Python tuples. A collective's other columns (COMM_ROW) live in its CommRecord
(comm.py) until its launch record is written.
"""
from __future__ import annotations

import struct

import numpy as np
import pyarrow as pa

from tracer.files.format import COLUMNS

# The columns of every event, in format.COLUMNS order; a collective's continue with COMM_ROW.
# The hot path packs OP_ROW and cid positionally (a test holds them to format.COLUMNS).
OP_ROW = ("t0", "t1", "op", "phase", "module", "stack", "fwd_stack", "annotation", "step",
          "thread", "shapes")
COMM_ROW = ("kind", "group", "peer", "bytes", "dtype", "async_op", "seq", "cid", "t_ret")
RECORD_FIELDS = OP_ROW + ("cid",)
RECORD = struct.Struct("<" + "q" * len(RECORD_FIELDS))
_INDEX = {name: i for i, name in enumerate(RECORD_FIELDS)}
_TYPES = dict(COLUMNS)
T1, OP, CID = _INDEX["t1"], _INDEX["op"], _INDEX["cid"]
MODULE, FWD_STACK = _INDEX["module"], _INDEX["fwd_stack"]
_COMM_HELD = tuple(name for name in COMM_ROW if name != "cid")   # kept by comm.CommRecord


def record(**values) -> bytes:
    """A packed record from column values given by name (the others are null); for the rows
    built outside the hot path."""
    fields = [-1] * len(RECORD_FIELDS)
    for name, value in values.items():
        try:
            fields[_INDEX[name]] = -1 if value is None else int(value)
        except KeyError:
            raise TypeError(f"record: no packed column named {name!r}") from None
    return RECORD.pack(*fields)


def unpack(records: bytes) -> np.ndarray:
    """Packed records -> an (n, len(RECORD_FIELDS)) int64 array (a copy: the caller may edit)."""
    return np.frombuffer(records, dtype=np.int64).reshape(-1, len(RECORD_FIELDS)).copy()


def comm_positions(table: np.ndarray) -> np.ndarray:
    """Rows of an unpacked run that carry a communication id."""
    return np.flatnonzero(table[:, CID] >= 0)


def comm_columns(table: np.ndarray, positions: np.ndarray, records: list) -> dict:
    """The COMM_ROW columns of an unpacked run, from the CommRecord (or None) of each row at
    ``positions``; a launch that completed gets its end in the table's t1, and one credited to
    a module (comm.CommTracker.owners) that module and forward stack in the table's."""
    if not len(positions):
        return {}
    columns = {name: np.full(len(table), -1, dtype=np.int64) for name in _COMM_HELD}
    for i, record in zip(positions.tolist(), records):
        if record is None:
            continue
        for name in _COMM_HELD:
            value = getattr(record, name)
            columns[name][i] = -1 if value is None else int(value)
        if record.t1 is not None:
            table[i, T1] = record.t1
        if record.credit is not None:
            table[i, MODULE], table[i, FWD_STACK] = record.credit
    return columns


def last_step_marker(table: np.ndarray, step_op: int) -> int:
    """Row of the last step marker of an unpacked run, or -1."""
    markers = np.flatnonzero(table[:, OP] == step_op)
    return int(markers[-1]) if len(markers) else -1


def to_arrays(table: np.ndarray, comm: dict) -> dict:
    """Column name -> pyarrow array (indices for dictionary columns) of an unpacked run.

    ``comm`` maps column name -> int64 numpy array for the communication columns the records
    do not hold (-1: null); ``t1`` there, where not -1, overrides the record's.
    """
    arrays = {}
    for j, name in enumerate(RECORD_FIELDS):
        arrays[name] = _array(name, table[:, j])
    for name, values in comm.items():
        arrays[name] = _array(name, values)
    return arrays


def _array(name: str, values: np.ndarray) -> pa.Array:
    typ = _TYPES[name]
    if pa.types.is_dictionary(typ):
        typ = typ.index_type
    null = values < 0
    if pa.types.is_boolean(typ):
        return pa.array(values > 0, mask=null, type=typ)
    # NOTE: the numpy type by name: pyarrow's to_pandas_dtype imports pandas in some versions
    values = values.astype(np.dtype(str(typ)), copy=False)
    return pa.array(values, mask=null if null.any() else None, type=typ)
