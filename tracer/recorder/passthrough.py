"""A failure inside the recorder never reaches the user's training step. An exception raised by
the recorder's own work around an op (a new stack node or a frame's classification, a storage
seen the first time, a shape key, the device recorder's start, an op's classification, the
queue) is caught by the hot path (csrc/hotpath/onop.c, Session.on_op, comm.special_op): the op
returns its result (an in-place op has already run), and that rank records nothing more for the rest
of the run, as outside recorded steps (the session's passthrough). The trace's metadata keeps why
(``recorder_error``: the error and the step) and stderr says it once. An exception that is not an
``Exception`` (KeyboardInterrupt, SystemExit) is the user's and goes on up."""
from __future__ import annotations

import sys


def recorder_failed(session, exc: BaseException) -> None:
    """``exc`` came from the recorder's own work: ``session`` stops recording, for good."""
    session.in_window = lambda step: False     # no step boundary turns recording back on
    session.recording, session.passthrough = False, True
    session.device_wanted = False
    if session.recorder_error is not None:  # said already (another thread's, at once)
        return
    error = f"{type(exc).__name__}: {exc}".strip()[:500]
    session.recorder_error = error
    session.flusher.add_meta({"recorder_error": {"error": error, "step": session.step_index}})
    print(f"paratrace: rank {session.rank}: the recorder failed at step {session.step_index} "
          f"({error}); this rank records nothing more, the run goes on", file=sys.stderr,
          flush=True)
