"""The live status file of a recording rank, ``rank-<R>.status.json`` (tracer.files.rundir):
its shape (:class:`Status`), its one writer (:func:`write_status`) and its one reader
(:func:`read_statuses`).

The flusher rewrites it (atomically) every flush interval and at the end; trace-run's watchdog
reads it to see whether a rank makes progress and which collective it is in. Keys (kept stable;
the watchdog and tests read them): rank, pid, now_ns, status, step, last_event_ns, events,
last_collective, inflight, failed_collectives, error, trace, final, config (what
``tracer.record_config`` set: the run's configuration, such as its number of steps).
"""
from __future__ import annotations

import json
import os
import time
from typing import Any, Optional, TypedDict, cast

from . import rundir


class CollectiveEntry(TypedDict, total=False):
    """A collective launch as the recorder describes it (its comm tracker): in status files and
    the trace's metadata, and in run.json's copies of them. ``group``: the global ranks (a
    list) or their text (``"0,1"``, ``?name`` where unresolved); ``seq``: its number in the
    group (P2P operations count apart); ``peer``: a P2P operation's other rank."""

    kind: str
    group: Any
    seq: Optional[int]
    peer: Optional[int]
    bytes: int
    t0: int
    step: int


class Status(TypedDict, total=False):
    """A status file. The recorder writes every key; a reader may meet a file without some
    (another version's, or one written by hand), so none is required."""

    rank: int
    pid: int
    now_ns: int
    status: str                    # tracer.vocab.outcomes.TraceStatus
    step: int
    last_event_ns: int
    events: Optional[int]
    last_collective: Optional[CollectiveEntry]
    inflight: list[CollectiveEntry]
    failed_collectives: list[CollectiveEntry]
    error: Optional[str]
    trace: str
    final: bool
    config: dict[str, Any]


def write_status(path: str, *, rank: int, status: str, step: int, last_event_ns: int,
                 events: Optional[int], last_collective: Optional[CollectiveEntry],
                 inflight: list[CollectiveEntry], failed_collectives: list[CollectiveEntry],
                 error: Optional[str], trace: str, final: bool, config: dict[str, Any]) -> None:
    """Replace the status file at ``path``; a failure to write is ignored (it is advisory)."""
    document: Status = {
        "rank": rank, "pid": os.getpid(), "now_ns": time.perf_counter_ns(), "status": status,
        "step": step, "last_event_ns": last_event_ns, "events": events,
        "last_collective": last_collective, "inflight": inflight,
        "failed_collectives": list(failed_collectives), "error": error, "trace": trace,
        "final": final, "config": dict(config),
    }
    tmp = path + ".tmp"
    try:
        with open(tmp, "w") as fh:
            json.dump(document, fh, default=str)
        os.replace(tmp, path)
    except OSError:
        pass


def read_statuses(traces_dir: str) -> dict[int, Status]:
    """rank -> the rank's latest status (files that cannot be read, or hold no JSON object, are
    skipped: a rank may be rewriting its own)."""
    statuses: dict[int, Status] = {}
    try:
        paths = rundir.rank_files(traces_dir, rundir.STATUS_EXT)
    except OSError:          # not created yet, or removed under us
        return statuses
    for rank, path in paths.items():
        try:
            with open(path) as fh:
                document = json.load(fh)
        except (OSError, ValueError):
            continue
        if isinstance(document, dict):
            statuses[rank] = cast(Status, document)
    return statuses


def write_session_status(session: Any, final: bool = False) -> None:
    """The status file of a recording session (tracer.recorder.session.Session), from its state."""
    flusher, comm = session.flusher, session.comm
    write_status(
        session.status_path, rank=session.rank, status=session.status,
        step=session.step_index, last_event_ns=session.last_event_ns,
        events=flusher.writer.events if flusher.writer else None,
        last_collective=comm.last, inflight=comm.inflight(), failed_collectives=comm.failed,
        error=session.error, trace=session.path, final=final, config=session.config)
