"""The device file of a rank: ``rank-<R>.device.arrow``, GPU activity beside the host trace.

One Arrow IPC stream (format ``paratrace.device``, version 1), a batch per recorded window,
each the CUPTI records of that window as :mod:`tracer.kineto.chrome_trace` reads them: kernels,
memcpys and memsets (start, end, device, stream, correlation, bytes) and the runtime/driver calls
that launched them (start, end, host thread, correlation). Times are Unix nanoseconds, as CUPTI
gives them; the host trace's metadata holds the pairs of clocks that place them on its own
clock (``clock_pairs``). A killed rank loses at most the window under way. Never pickled.
"""
from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

import numpy as np
import pyarrow as pa

from .format import TraceError, write_options

KINDS = ("kernel", "memcpy", "memset", "runtime", "driver")


@dataclass
class DeviceRecords:
    """GPU activities and the host calls that launched them, as numpy columns. Times are
    Unix nanoseconds; ``kind`` indexes :data:`KINDS`, ``name`` indexes ``names``."""

    kind: np.ndarray
    name: np.ndarray
    start: np.ndarray
    end: np.ndarray
    device: np.ndarray
    stream: np.ndarray
    corr: np.ndarray
    tid: np.ndarray
    nbytes: np.ndarray
    names: list[str]
    rank: Optional[int] = None          # distributedInfo.rank of an export, if it says
    meta: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.kind)

    @property
    def is_launch(self) -> np.ndarray:
        return self.kind >= KINDS.index("runtime")

    def concat(self, other: "DeviceRecords") -> "DeviceRecords":
        """Both sets of records, names re-coded into one list."""
        names = list(self.names)
        index = {n: i for i, n in enumerate(names)}
        recode = np.array([index.setdefault(n, len(index)) for n in other.names] or [0],
                          dtype=np.int64)
        names = sorted(index, key=index.__getitem__)
        cols = {f: np.concatenate([getattr(self, f), getattr(other, f)])
                for f in ("kind", "start", "end", "device", "stream", "corr", "tid", "nbytes")}
        return DeviceRecords(name=np.concatenate([self.name, recode[other.name]]), names=names,
                             rank=self.rank if self.rank is not None else other.rank,
                             meta={**other.meta, **self.meta}, **cols)


def empty() -> DeviceRecords:
    z = np.zeros(0, dtype=np.int64)
    return DeviceRecords(z, z, z, z, z, z, z, z, z, [])


FORMAT_NAME = "paratrace.device"
FORMAT_VERSION = 1
_META = b"paratrace.meta"
SCHEMA = pa.schema([
    ("kind", pa.dictionary(pa.int8(), pa.string())),
    ("name", pa.dictionary(pa.int32(), pa.string())),
    ("start", pa.int64()), ("end", pa.int64()), ("device", pa.int16()), ("stream", pa.int32()),
    ("corr", pa.int64()), ("tid", pa.int64()), ("bytes", pa.int64()),
])


class DeviceWriter:
    """Appends one batch per recorded window. Not thread-safe: one flusher writes. ``sink``:
    an Arrow output stream to write to instead of the file at ``path``."""

    def __init__(self, path: str, meta: dict[str, Any], sink: Any = None):
        self.path = path
        header = {b"paratrace.format": FORMAT_NAME.encode(),
                  b"paratrace.version": str(FORMAT_VERSION).encode(),
                  _META: json.dumps(meta).encode()}
        self._sink = pa.OSFile(path, "wb") if sink is None else sink
        self._writer = pa.ipc.new_stream(
            self._sink, SCHEMA.with_metadata(header),
            options=write_options(dictionary_deltas=False))
        self.records = 0

    def write(self, records: DeviceRecords, meta: dict[str, Any]) -> None:
        n = len(records)
        arrays = [
            pa.DictionaryArray.from_arrays(pa.array(records.kind, pa.int8()),
                                           pa.array(list(KINDS), pa.string())),
            pa.DictionaryArray.from_arrays(pa.array(records.name, pa.int32()),
                                           pa.array(records.names or [""], pa.string())),
        ] + [pa.array(getattr(records, f), type=t) for f, t in (
            ("start", pa.int64()), ("end", pa.int64()), ("device", pa.int16()),
            ("stream", pa.int32()), ("corr", pa.int64()), ("tid", pa.int64()),
            ("nbytes", pa.int64()))]
        batch = pa.RecordBatch.from_arrays(arrays, schema=SCHEMA)
        self._writer.write_batch(batch, custom_metadata={_META: json.dumps(meta).encode()})
        self.records += n

    def close(self) -> None:
        self._writer.close()
        self._sink.close()


@functools.lru_cache(maxsize=1)
def warm_up() -> bytes:
    """A one-row stream written to memory, as :class:`DeviceWriter` writes a batch, once per
    process; returns its bytes. pyarrow's first dictionary arrays and compressed IPC batch cost
    once what later batches do not (on the CPU: 12.5 ms for a first batch of 8,000 rows, 0.9 ms
    for the next; 1.5 ms after this). A recorder whose flusher writes while the training thread runs calls it
    before the first step, so that the first write does not hold the GIL that long."""
    sink = pa.BufferOutputStream()
    writer = DeviceWriter("", {"warm_up": True}, sink=sink)
    one = np.zeros(1, dtype=np.int64)
    writer.write(DeviceRecords(one, one, one, one, one, one, one, one, one, ["warm-up"]), {})
    writer._writer.close()
    return sink.getvalue().to_pybytes()


def read_device(path: str) -> tuple[DeviceRecords, list[dict[str, Any]], Optional[str]]:
    """(DeviceRecords of every complete batch, metadata dicts, problem or None). Raises
    TraceError for a file that is not a paratrace device file at all."""
    if not os.path.exists(path):
        raise TraceError(f"{path}: no such device file")
    try:
        reader = pa.ipc.open_stream(pa.memory_map(path, "r"))
    except (pa.ArrowInvalid, OSError) as exc:
        raise TraceError(f"{path}: not a paratrace device file ({str(exc)[:120]})") from None
    header = reader.schema.metadata or {}
    if header.get(b"paratrace.format") != FORMAT_NAME.encode():
        raise TraceError(f"{path}: not a paratrace device file")
    if int(header.get(b"paratrace.version", b"0")) > FORMAT_VERSION:
        raise TraceError(f"{path}: device format version {int(header[b'paratrace.version'])} "
                         f"is newer than this paratrace reads (up to {FORMAT_VERSION})")
    out = empty()
    metas: list[dict[str, Any]] = []
    damage: list[str] = []
    for records, meta in intact_batches(reader, damage):
        out = out.concat(records)
        if meta is not None:
            metas.append(meta)
    problem = f"truncated after {len(out):,} device records ({damage[0]})" if damage else None
    return out, metas, problem


def intact_batches(reader: Any, damage: list[str]
                   ) -> Iterator[tuple[DeviceRecords, Optional[dict[str, Any]]]]:
    """(DeviceRecords, its window's meta dict or None) of each batch of an open device
    stream, up to the end or to a batch cut short, whose error (120 characters) is appended
    to ``damage``."""
    while True:
        try:
            batch, custom = reader.read_next_batch_with_custom_metadata()
        except StopIteration:
            return
        except (pa.ArrowInvalid, OSError, ValueError) as exc:
            damage.append(str(exc)[:120])
            return
        meta = json.loads(custom[_META]) if custom and _META in custom else None
        yield _records(batch), meta


def _records(batch: pa.RecordBatch) -> DeviceRecords:
    kind = batch.column("kind")
    kind_codes = np.array([KINDS.index(k) for k in kind.dictionary.to_pylist()] or [0],
                          dtype=np.int64)[kind.indices.to_numpy(zero_copy_only=False)]
    name = batch.column("name")
    cols = {f: batch.column(c).to_numpy(zero_copy_only=False).astype(np.int64)
            for f, c in (("start", "start"), ("end", "end"), ("device", "device"),
                         ("stream", "stream"), ("corr", "corr"), ("tid", "tid"),
                         ("nbytes", "bytes"))}
    return DeviceRecords(kind=kind_codes,
                         name=name.indices.to_numpy(zero_copy_only=False).astype(np.int64),
                         names=name.dictionary.to_pylist(), **cols)
