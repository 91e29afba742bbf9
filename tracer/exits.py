"""How a recording process leaves: ``os._exit`` closes the trace first, and the trace says how
the process left (``exit`` in its metadata, docs/trace-format.md).

``os._exit(n)`` ends a process at once: no ``finally``, no ``atexit``, no flusher turn. Some
training scripts call it on purpose (to skip a slow teardown), and a rank that called it
mid-step used to leave a trace of 0 rows. While a trace is active, :func:`patch_os_exit`
replaces ``os._exit`` with a wrapper that closes the trace (every queued row, the closing
metadata, the final status file) and then calls the real one. ``sys.exit`` raises SystemExit,
which unwinds through the session's ``__exit__``: its trace closes as for any ending, with the
same ``exit`` entry. What no code in the process can cover: SIGKILL (the kernel ends it; the
trace keeps everything up to the last flush, at most the flush interval before), ``os.abort``
and fatal signals (faulthandler prints the stack), ``exec``.
"""
from __future__ import annotations

import os
from typing import Optional

from . import _active


def exit_code(code) -> int:
    """The status a process leaving with ``sys.exit(code)`` / ``os._exit(code)`` reports:
    None is 0, an int itself, anything else (a message) 1, as Python does."""
    if code is None:
        return 0
    return code if isinstance(code, int) and not isinstance(code, bool) else 1


def exit_meta(how: str, code, step: int) -> dict:
    """The trace's ``exit`` entry: how the process left, with what status, in which step."""
    return {"exit": {"how": how, "code": exit_code(code), "step": step}}


def patch_os_exit(session) -> callable:
    """Replace ``os._exit`` while ``session`` records; returns the undo. Only the process
    that started the trace closes it: a child forked from it (multiprocessing's workers end
    with ``os._exit``) holds a copy of the session and the trace file's descriptor, and
    writing through them would corrupt the parent's trace."""
    original = os._exit
    owner = os.getpid()

    def _exit(n):
        if os.getpid() == owner:
            try:
                leave(session, n)
            except Exception:      # nothing may stop the exit the program asked for
                pass
        original(n)

    os._exit = _exit

    def undo() -> None:
        if os._exit is _exit:
            os._exit = original
    return undo


def leave(session, code, ended_by: Optional[str] = None) -> None:
    """Close ``session``'s trace because the process leaves with ``code`` now: status ok for
    0, else failed (``os._exit(N)``); ``ended_by``: ended from outside (interrupted, with that
    reason). A status set earlier (an error being handled) is kept. Idempotent; safe from any
    thread of the owning process."""
    if not session._open:
        return
    code = exit_code(code)
    if session.status == "running":
        if ended_by:
            session.status, session.error = "interrupted", ended_by
        else:
            session.status = "ok" if code == 0 else "failed"
            session.error = f"os._exit({code})" if code else None
    session._flusher.add_meta(exit_meta("os._exit", code, session.step_index))
    session.close()
    if _active.ACTIVE is session:
        _active.ACTIVE = None
