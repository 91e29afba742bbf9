"""The live status file of a recording rank, ``rank-<R>.status.json`` (tracer.files.rundir).

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
from typing import Optional


def write_status(path: str, *, rank: int, status: str, step: int, last_event_ns: int,
                 events: Optional[int], last_collective: Optional[dict], inflight: list,
                 failed_collectives: list, error: Optional[str], trace: str, final: bool,
                 config: dict) -> None:
    """Replace the status file at ``path``; a failure to write is ignored (it is advisory)."""
    document = {
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


def write_session_status(session, final: bool = False) -> None:
    """The status file of a recording session (tracer.recorder.session.Session), from its state."""
    flusher, comm = session._flusher, session._comm
    write_status(
        session.status_path, rank=session.rank, status=session.status,
        step=session.step_index, last_event_ns=session._last_event_ns,
        events=flusher.writer.events if flusher.writer else None,
        last_collective=comm.last, inflight=comm.inflight(), failed_collectives=comm.failed,
        error=session.error, trace=session.path, final=final, config=session.config)
