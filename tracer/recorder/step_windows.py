"""Session's step windows: :class:`StepWindows`, the base of Session that advances steps, opens
and leaves recorded windows (``--steps``), records annotation ranges and step marks, and tells
the device recorder where steps begin. Session (session.py) owns the state it reads.
"""
from __future__ import annotations

import threading
import time

from tracer.vocab import ops
from tracer.vocab.labels import PHASE_OTHER

from . import rows
from .attribution.annotations import Range
from .device.kineto_windows import pairs_meta
from .op_path import OpPath

_now = time.perf_counter_ns
_get_ident = threading.get_ident


class StepWindows(OpPath):
    """Steps and their windows, on top of the hot path: ``tracer.step()``, the optimizer's
    automatic steps, and the dispatch mode and module hooks on only in recorded steps."""

    def annotate(self, label: str, attrs: dict) -> Range:
        return Range(self, label, attrs)

    def open_range(self, label: str, attrs: dict) -> tuple:
        return self._annotations.push(label, attrs)

    def close_range(self, entry: tuple, t0: int, module: int = -1, stack: int = -1) -> None:
        """Record the range (with itself in its annotation; the module and stack that opened
        it, where known) and close it."""
        if self.recording and not self.paused:
            hint = self._annotations.phase_hint
            self.push(rows.record(
                t0=t0, t1=_now(), op=self.op_ids(ops.OP_ANNOTATION),
                phase=hint if hint is not None else PHASE_OTHER, module=module, stack=stack,
                annotation=self._annotations.current, step=self.step_index,
                thread=self.thread_number()))
        self._annotations.pop(entry)

    def step(self) -> None:
        self._explicit_steps = True
        self._advance_step()

    def _advance_step(self) -> None:
        self.step_index += 1
        self.fwd_prev, self.fwd_of_node = self.fwd_of_node, {}
        recording = self.in_window(self.step_index)
        if recording != self.recording:
            self.recording = recording
            self.passthrough = not recording or self.paused > 0
            self._annotations.set_live(recording)
            if self._memory is not None:     # its module hooks: on in recorded steps only
                self._memory.follow_window(recording)
            if recording:
                self._enter_window()
            else:
                self._leave_window()
        if recording:
            t = _now()
            self.push(rows.record(t0=t, t1=t, op=self.op_ids(ops.OP_STEP), phase=PHASE_OTHER,
                                   step=self.step_index, thread=self.thread_number()))
        if self._device is not None:
            self._device_step()
        self._flusher.wake()     # the finished step goes to disk now, not at the next interval

    def _device_step(self) -> None:
        self.device_wanted = self._device.boundary(self.recording)
        self._flusher.add_meta(pairs_meta(self._pairs))

    def _start_device(self) -> None:
        self.device_wanted = False
        if self._device.start():
            self._flusher.add_meta(pairs_meta(self._pairs))

    def _leave_window(self) -> None:
        """Outside recorded steps the dispatch mode and the module hooks are off: those steps
        run as they would untraced. Possible only on the thread that entered the mode and
        with the mode on top of its stack; otherwise it stays on and records nothing."""
        if _get_ident() != self.owner or not self._mode.suspend():
            return
        self._stacks.release()
        if self.options.record_modules and self._modules.idle:
            self._modules.remove()

    def _enter_window(self) -> None:
        # NOTE: a window opening on another thread than the trace's cannot put the mode back on
        # that thread's stack; steps advance on it in practice (optimizer steps, tracer.step())
        if _get_ident() != self.owner or not self._mode.suspended:
            return
        self._mode.resume()
        self.open_ranges = 0    # ranges that ended unseen while suspended must not block windows
        if self.options.record_modules and not self._modules.installed:
            self._modules.install()

    def optimizer_post(self, optimizer, args, kwargs) -> None:
        """After an optimizer step (patches/autograd.py's hook): the outermost one's end is a
        step boundary."""
        self.in_optimizer = max(0, self.in_optimizer - 1)
        if self.in_optimizer == 0 and self.options.auto_step and not self._explicit_steps:
            self._advance_step()

