"""The patches into torch.autograd.profiler: before a user's torch.profiler prepares Kineto's
session, the session's device recorder lets go of it and of CUPTI, and records no device time
until the profiler disables the session again (device_notes.py says why).

torch.profiler.profile and torch.autograd.profiler.profile both prepare through
``torch.autograd.profiler._prepare_profiler`` and end through its ``_disable_profiler``, module
globals looked up at each call (torch 2.10 to 2.14.1). The device recorders' own windows go
through ``torch.autograd``'s binding, or, on torch.profiler's path, say so first
(``DeviceNotes.own_profiler_calls``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from . import Patches


def install(patches: "Patches", session) -> None:
    """Wrap ``_prepare_profiler`` (the session's device recorder, if it has one, first) and
    ``_disable_profiler`` (the recorder told after)."""
    try:
        import torch.autograd.profiler as python_side
    except ImportError:   # pragma: no cover - every torch of the range has it
        return

    def before(original):
        def _prepare_profiler(*args, **kwargs):
            device = session._device
            if device is not None:
                device.profiler_starting()
            return original(*args, **kwargs)
        return _prepare_profiler

    def after(original):
        def _disable_profiler(*args, **kwargs):
            try:
                return original(*args, **kwargs)
            finally:
                device = session._device
                if device is not None:
                    device.profiler_stopped()
        return _disable_profiler
    patches.wrap(python_side, "_prepare_profiler", before)
    patches.wrap(python_side, "_disable_profiler", after)
