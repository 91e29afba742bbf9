"""How a recording process leaves: ``os._exit`` closes the trace first, and the trace says how
the process left (``exit`` in its metadata, docs/trace-format.md).

``os._exit(n)`` ends a process at once: no ``finally``, no ``atexit``, no flusher turn. Some
training scripts call it on purpose (to skip a slow teardown), and a rank that called it
mid-step used to leave a trace of 0 rows. While a trace is active, ``os._exit`` is a wrapper
(tracer/recorder/patches/process.py) that closes the trace (:func:`leave_first`: every queued row,
the closing metadata, the final status file) and then calls the real one. ``sys.exit`` raises
SystemExit, which unwinds through the session's ``__exit__``: its trace closes as for any
ending, with the same ``exit`` entry. What no code in the process can cover: SIGKILL (the
kernel ends it; the trace keeps everything up to the last flush, at most the flush interval
before), ``os.abort`` and fatal signals (faulthandler prints the stack), ``exec``.

A process forked while recording (a DataLoader or multiprocessing worker, or ``os.fork`` in the
script) holds a copy of the session, its queue and the trace file's descriptor. Whatever it
then wrote (its own hot path flushing a full queue, its close when it leaves through the
``with`` block) would land in the parent's file. :func:`detach_forked_child` (a fork handler,
tracer/recorder/patches/process.py) makes the child's copy record nothing and close nothing.
"""
from __future__ import annotations

import os
from typing import Optional

from .. import _active


def exit_code(code) -> int:
    """The status a process leaving with ``sys.exit(code)`` / ``os._exit(code)`` reports:
    None is 0, an int itself, anything else (a message) 1, as Python does."""
    if code is None:
        return 0
    return code if isinstance(code, int) and not isinstance(code, bool) else 1


def exit_meta(how: str, code, step: int) -> dict:
    """The trace's ``exit`` entry: how the process left, with what status, in which step."""
    return {"exit": {"how": how, "code": exit_code(code), "step": step}}


def leave_first(session, owner: int, code) -> None:
    """What ``os._exit(code)`` does first while ``session`` records
    (tracer/recorder/patches/process.py wraps it): close the trace. Only in the process that
    started it (``owner``, its pid): a child forked from it (multiprocessing's workers end with
    ``os._exit``) holds a copy of the session and the trace file's descriptor, and writing through
    them would corrupt the parent's trace. Never raises: nothing may stop the exit the program
    asked for."""
    if os.getpid() != owner:
        return
    try:
        leave(session, code)
    except Exception:
        pass


def detach_forked_child() -> None:
    """In a child just forked from a recording process: its copy of the active session stops
    recording, for good, and never writes (os.register_at_fork runs this in the child)."""
    session = _active.ACTIVE
    if session is None:
        return
    session.in_window = lambda step: False     # no step boundary turns recording back on
    session.recording, session.passthrough = False, True
    session.is_open = False                    # close() and os._exit's close write nothing
    if session.memory is not None:          # nor does memory recording's hooks or table
        session.memory.detach()
    _active.ACTIVE = None


def leave(session, code, ended_by: Optional[str] = None) -> None:
    """Close ``session``'s trace because the process leaves with ``code`` now: status ok for
    0, else failed (``os._exit(N)``); ``ended_by``: ended from outside (interrupted, with that
    reason). A status set earlier (an error being handled) is kept. Idempotent; safe from any
    thread of the owning process."""
    if not session.is_open:
        return
    code = exit_code(code)
    if session.status == "running":
        if ended_by:
            session.status, session.error = "interrupted", ended_by
        else:
            session.status = "ok" if code == 0 else "failed"
            session.error = f"os._exit({code})" if code else None
    session.flusher.add_meta(exit_meta("os._exit", code, session.step_index))
    session.close()
    if _active.ACTIVE is session:
        _active.ACTIVE = None
