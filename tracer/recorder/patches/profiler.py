"""The patches into torch.autograd.profiler: before a user's torch.profiler prepares Kineto's
session, the session's device recorder lets go of it and of CUPTI, and records no device time
until the profiler disables the session again (device_notes.py says why); and while it runs the
recording mode marks its dispatches, so that the profile it returns reads as it would without
the mode (user_profile.py).

torch.profiler.profile and torch.autograd.profiler.profile both prepare through
``torch.autograd.profiler._prepare_profiler`` and end through its ``_disable_profiler``, module
globals looked up at each call (torch 2.10 to 2.14.1). The device recorders' own windows go
through ``torch.autograd``'s binding, or, on torch.profiler's path, say so first
(``DeviceNotes.own_profiler_calls``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..compat import PROFILER_MARK, PROFILER_PASSED, UserProfileResult

if TYPE_CHECKING:
    from . import Patches


def _mark(session) -> bool:
    """Mark the recording mode's dispatches for a user's profiler (not for the device recorder's
    own windows; a no-op where this torch cannot)."""
    mode, device = session.mode, session.device
    if mode is None or PROFILER_MARK is None or getattr(device, "_own_call", False):
        return False
    mode.mark_dispatch(PROFILER_MARK, PROFILER_PASSED)
    return True


def install(patches: "Patches", session) -> None:
    """Wrap ``_prepare_profiler`` (the session's device recorder, if it has one, first; then the
    mode's marks) and ``_disable_profiler`` (the result read without the mode's events, the
    marks and the device recorder told after)."""
    try:
        import torch.autograd.profiler as python_side
    except ImportError:   # pragma: no cover - every torch of the range has it
        return
    marking = [False]

    def before(original):
        def _prepare_profiler(*args, **kwargs):
            device = session.device
            if device is not None:
                device.profiler_starting()
            marking[0] = _mark(session)
            return original(*args, **kwargs)
        return _prepare_profiler

    def after(original):
        def _disable_profiler(*args, **kwargs):
            try:
                result = original(*args, **kwargs)
                if marking[0] and result is not None:
                    result = UserProfileResult(result)
                return result
            finally:
                if marking[0] and session.mode is not None:
                    session.mode.unmark_dispatch()
                marking[0] = False
                device = session.device
                if device is not None:
                    device.profiler_stopped()
        return _disable_profiler
    patches.wrap(python_side, "_prepare_profiler", before)
    patches.wrap(python_side, "_disable_profiler", after)
