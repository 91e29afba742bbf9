"""The patches into os: ``os._exit`` closes the trace first, and a child forked while recording
records nothing (exits.py)."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

from tracer.recorder.process import exits

if TYPE_CHECKING:
    from . import Patches

# NOTE: Python cannot unregister a fork handler: it is registered once, when the recorder is
# imported, and does nothing in a process that records nothing
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=exits.detach_forked_child)


def install(patches: "Patches", session) -> None:
    """``os._exit(n)`` closes ``session``'s trace, then exits (exits.leave_first)."""
    owner = os.getpid()

    def make(original):
        def _exit(n):
            exits.leave_first(session, owner, n)
            original(n)
        return _exit
    patches.wrap(os, "_exit", make)
