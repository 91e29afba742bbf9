"""What the two device recorders share (Kineto's windows,
:mod:`tracer.recorder.device.kineto_windows`; CUPTI driven directly,
:mod:`tracer.recorder.device.cupti_direct`): the errors of a rank's device recording, and the user's
own torch.profiler.

A torch.profiler holds Kineto's session and CUPTI while it runs, and the process has one of
each. Measured without paratrace's recorder (a torch.autograd binding window standing in for
it, CPU activity, 2026-11-27): a user's profiler started and stopped inside a window made the
window's stop crash the process (SIGSEGV, torch 2.13.0 and 2.14.1) or raise "Can't disable
Kineto profiler when it's not running" (2.10.0, 2.11.0); a window stopped while the user's
profiler ran left the user's profile empty (2.13.0, 2.14.1) or made its stop raise (2.10.0,
2.11.0). So the recorders let go first: before a user's profiler prepares its session
(the patch of :mod:`tracer.recorder.patches.profiler`), the session's recorder ends what it has
under way (:meth:`DeviceNotes.profiler_starting`). From then until the user's profiler
disables its session (:meth:`DeviceNotes.profiler_stopped`), no device time is recorded: a
scheduled profiler's warm-up has prepared a session without enabling it yet, and a window
started then would cancel it. Recording resumes at the first recorded step after. Said once.
"""
from __future__ import annotations

import contextlib
import sys
from typing import Optional

# a user's torch.profiler holds CUPTI: the metadata's error, and the line on stderr
PROFILER_RUNNING = "torch.profiler is already running in this process"
PROFILER_RUNNING_SAID = ("torch.profiler already holds CUPTI; no device time while it runs "
                         "(trace-report --kineto merges your profile)")
PROFILER_STARTED = ("a torch.profiler started while recording: no device time while it runs; "
                    "it resumes at the first recorded step after the profiler stops "
                    "(trace-report --kineto merges its export)")


def profiler_enabled() -> bool:
    """Whether a profiler session (a user's, or a window of this process's) is enabled."""
    import torch
    return torch.autograd._profiler_enabled()


class DeviceNotes:
    """What went wrong recording a rank's device time, for the trace's ``device_time``: the
    first error in words, every one counted; and a line on stderr, said once. And what a
    user's torch.profiler starting asks of the recorder (see the module docstring)."""

    def __init__(self, rank: int):
        self.rank = rank
        self.error: Optional[str] = None      # the first error; later ones are counted
        self.errors = 0
        self._said: set = set()               # the topics said on stderr (say_once)
        self._own_call = False                # this recorder's own window starts or stops
        self._user_profiling = False          # a user's profiler prepared, not yet disabled
        self._closed = False

    def _note(self, error: Optional[str]) -> None:
        """An error of the device recording: the first is kept in words, every one counted."""
        if error:
            self.error = self.error or error
            self.errors += 1

    def say_once(self, error: str, line: Optional[str] = None, topic: str = "recorder") -> None:
        """``error`` in the metadata and ``line`` (default: the same) on stderr, the first time
        anything is said of ``topic`` only."""
        if topic in self._said:
            return
        self._said.add(topic)
        self._note(error)
        print(f"paratrace: rank {self.rank}: {line or error}", file=sys.stderr, flush=True)

    def profiler_running(self, recorded_before: bool) -> bool:
        """Whether a user's torch.profiler holds CUPTI now (checked before this recorder
        starts); said once. ``recorded_before``: whether this recorder had recorded already."""
        if not (self._user_profiling or profiler_enabled()):
            return False
        if recorded_before:
            self.say_once(PROFILER_STARTED, topic="profiler")
        else:
            self.say_once(PROFILER_RUNNING, PROFILER_RUNNING_SAID, topic="profiler")
        return True

    @contextlib.contextmanager
    def own_profiler_calls(self):
        """This recorder's own window starting or stopping (on torch.profiler's path it goes
        through the patched functions): not a user's profiler."""
        self._own_call = True
        try:
            yield
        finally:
            self._own_call = False

    def profiler_stopped(self) -> None:
        """A profiler disabled its session (the patch's call, after it)."""
        if not self._own_call:
            self._user_profiling = False

    def profiler_starting(self) -> None:
        """A torch.profiler is about to prepare its session, on the thread starting it (the
        patch's call); never raises."""
        if self._closed or self._own_call:
            return
        self._user_profiling = True
        try:
            if self.yield_to_profiler():
                self.say_once(PROFILER_STARTED, topic="profiler")
        except Exception as exc:    # never in the way of the user's profiler
            self._note(f"ending the device recording for a torch.profiler: "
                       f"{type(exc).__name__}: {exc}")

    def yield_to_profiler(self) -> bool:
        """End what this recorder has under way, before a user's profiler starts; whether
        there was something."""
        raise NotImplementedError

    def closing(self) -> None:
        """Closing: a profiler starting from now on asks nothing of this recorder."""
        self._closed = True
