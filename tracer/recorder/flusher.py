"""The flusher: a thread that turns the hot path's queued records into Arrow batches on disk.

The hot path appends packed records (rows.py) to :attr:`Flusher.queue`; every
``flush_interval`` seconds, soon after a step ends (:meth:`Flusher.wake`), when the queue grows
past what the session allows, and at close, :meth:`Flusher.flush` writes them with the
metadata updates gathered since the last batch, and the content hashes of the source files the
batch's new stacks name (``sources``, process_info.SourceHashes). Everything that touches the
writer goes through one lock, so a rename (the process group arrives with another rank) or a
metadata update from another thread cannot interleave with a write.
"""
from __future__ import annotations

import collections
import threading
import time
from typing import Callable, Optional

from tracer.files.format import TraceWriter, rename

from . import rows
from .process.process_info import SourceHashes

# NOTE: each batch costs about half a millisecond and 2 KB however few its rows; steps shorter
# than this share a flush (their rows still go in batches that end at a step boundary). At
# 0.05 s a 50 ms step flushed every step: 3.0 ms of the flusher's CPU a step, 1.6 ms at 0.1 s
# (docs/overhead.md)
STEP_FLUSH_GAP = 0.1         # seconds: least time between flushes that step boundaries ask for


class Flusher:
    """Owns the queue, the writer and the metadata waiting for the next batch."""

    def __init__(self, dictionaries, step_op: Callable[[], int], interval: float,
                 after_flush: Callable[[], None], on_error: Callable[[Exception], None]):
        self.queue: collections.deque = collections.deque()    # packed records (rows.py)
        self.lock = threading.RLock()
        self.writer: Optional[TraceWriter] = None
        self._dicts, self._step_op = dictionaries, step_op
        self.comm = None                   # the session's CommTracker: launches' columns
        self._interval = interval
        self._after_flush, self._on_error = after_flush, on_error
        self._meta: dict = {}
        self._sources = SourceHashes()
        self._stop = threading.Event()
        self._wake = threading.Event()     # set: write now
        self._thread: Optional[threading.Thread] = None

    def open(self, path: str, meta: dict) -> None:
        """Create the trace file and start the thread. An empty first batch makes the file
        valid at once: a rank killed before its first flush leaves a readable trace with no
        events rather than an empty file."""
        # NOTE: pyarrow imports numpy.ma the first time it converts a masked array, and an
        # import holds the GIL: in the flusher's first batch it stopped training for about
        # 20 ms (docs/overhead.md). Imported here, at the trace's start, instead.
        import numpy.ma  # noqa: F401
        self.writer = TraceWriter(path, meta)
        self.writer.write([], self._dicts.values(), None)
        self._thread = threading.Thread(target=self._loop, name="paratrace-flusher", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """A step ended: its rows go to disk now, not at the next interval."""
        self._wake.set()

    def add_meta(self, values: dict) -> None:
        """Metadata for the next batch. NOTE: under the lock: flush swaps the dict (and an
        update computed by a slow call, a clock estimate, must not land in the old one)."""
        with self.lock:
            self._meta.update(values)

    def merge_meta(self, key: str, values: dict) -> None:
        """Update the dict-valued metadata entry ``key`` for the next batch."""
        with self.lock:
            merged = dict(self._meta.get(key) or {})
            merged.update(values)
            self._meta[key] = merged

    def rename(self, path: str) -> None:
        with self.lock:
            if self.writer is not None:
                rename(self.writer, path)

    def stop(self) -> None:
        """Stop the thread (close() writes what is left)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=10)

    def close(self) -> None:
        """Write what is left and close the file."""
        self.flush()
        with self.lock:
            if self.writer is not None:
                self.writer.close()
                self.writer = None

    def _loop(self) -> None:
        gap = min(self._interval, STEP_FLUSH_GAP)
        last = time.monotonic()
        while not self._stop.is_set():
            if self._wake.wait(self._interval):     # a step ended: flush, but not too often
                self._stop.wait(max(0.0, last + gap - time.monotonic()))
            self._wake.clear()
            if self._stop.is_set():
                break                   # close() writes the rest
            last = time.monotonic()
            try:
                self.flush()
                self._after_flush()
            except Exception as exc:  # never let the flusher kill the run; reported at close
                self._on_error(exc)

    def flush(self) -> None:
        with self.lock:
            if self.writer is None:
                return
            queue = self.queue
            records = b"".join([queue.popleft() for _ in range(len(queue))])
            sources = self._sources.fresh(self._dicts.stacks.values)
            if sources:               # the reader merges this key batch by batch
                self._meta["sources"] = {**self._meta.get("sources", {}), **sources}
            renamed = self.comm.names.take_renamed() if self.comm is not None else {}
            if renamed:                                       # and this one, group by group
                self._meta["process_groups"] = {**self._meta.get("process_groups", {}),
                                                **renamed}
            meta, self._meta = self._meta, {}
            if not records and not meta:
                return
            table = rows.unpack(records)
            positions = rows.comm_positions(table)
            with self.comm.lock:
                launched = self.comm.written(table[positions, rows.CID])
            arrays = rows.to_arrays(table, rows.comm_columns(table, positions, launched))
            dictionaries = self._dicts.values()
            n = len(table)
            # NOTE: the rows of finished steps go in a batch of their own: a file cut short in
            # its last batch (a crash while writing, a truncated copy) keeps every finished step
            split = rows.last_step_marker(table, self._step_op())
            if split > 0:
                self.writer.write_arrays({k: a.slice(0, split) for k, a in arrays.items()},
                                         split, dictionaries)
                arrays = {k: a.slice(split) for k, a in arrays.items()}
                n -= split
            self.writer.write_arrays(arrays, n, dictionaries, meta or None)
