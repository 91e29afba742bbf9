"""The annotation ranges enclosing the ops being recorded: ``tracer.annotate`` ranges and
``torch.profiler.record_function`` ranges (seen as profiler ops in the dispatch stream).

Every op carries the interned JSON list of the ranges around it, outermost first; the innermost
range whose label names a phase (tracer.vocab.labels) sets the phase of the ops inside.
"""
from __future__ import annotations

import contextlib
import functools
import json
from time import perf_counter_ns as _now
from typing import Optional

from tracer.vocab.labels import phase_of_attrs

# The hint of an unrecorded range that makes the ranges around it name no phase for the ops
# inside (an optimizer's closure runs forward and backward inside the optimizer's range)
NO_PHASE = -1


class AnnotationStack:
    """The open ranges, the interned id of their JSON list and the phase they imply."""

    def __init__(self, intern):
        self._intern = intern                   # JSON text -> id
        self._entries: list = []                # [(label, attrs, phase hint)], outermost first
        self._record_functions: list = []       # open record_function ranges: (entry, t0)
        self.current = -1                       # id of the JSON list of open ranges, -1: none
        self.phase_hint: Optional[int] = None   # phase named by the innermost range naming one
        # outside recorded steps nothing reads current or phase_hint: the ranges are still
        # kept (one may enclose the next recorded step) but not encoded until recording starts
        self._live = True

    def push(self, label: str, attrs: dict) -> tuple:
        entry = (label, attrs, phase_of_attrs(label, attrs))
        self._entries.append(entry)
        self._refresh()
        return entry

    def force(self, phase: int) -> tuple:
        """An unnamed range that sets the phase of the ops inside and is not recorded; close it
        with :meth:`pop` (phases.py: DDP's constructor is setup; :data:`NO_PHASE`: an
        optimizer's closure, whose ops get their phases as outside any range)."""
        entry = (None, {}, phase)
        self._entries.append(entry)
        self._refresh()
        return entry

    @contextlib.contextmanager
    def forced(self, phase: int):
        """:meth:`force` around a block."""
        entry = self.force(phase)
        try:
            yield
        finally:
            self.pop(entry)

    def forcing(self, phase: int, fn):
        """``fn`` with the ops it runs in ``phase`` (a patch's wrapper)."""
        @functools.wraps(fn)
        def call(*args, **kwargs):
            with self.forced(phase):
                return fn(*args, **kwargs)
        return call

    def pop(self, entry: tuple) -> None:
        # NOTE: by identity, from the inside: a range left open by an exception is dropped
        # with the one that encloses it only when that one closes
        for i in range(len(self._entries) - 1, -1, -1):
            if self._entries[i] is entry:
                del self._entries[i]
                break
        self._refresh()

    def open_record_function(self, entry: tuple, t0: int) -> None:
        self._record_functions.append((entry, t0))

    def close_record_function(self) -> Optional[tuple]:
        """(entry, t0) of the innermost open record_function range, or None.

        NOTE: the handle's Python wrapper differs between enter and exit, so ranges are matched
        LIFO, as ``with record_function(...)`` nests them.
        """
        return self._record_functions.pop() if self._record_functions else None

    def set_live(self, live: bool) -> None:
        """Whether ops are being recorded (current and phase_hint read); they are brought up to
        date when recording starts."""
        self._live = live
        if live:
            self._refresh()

    def _refresh(self) -> None:
        if not self._live:
            return
        if not self._entries:
            self.current, self.phase_hint = -1, None
            return
        payload = [dict({"label": label}, **attrs) for label, attrs, _ in self._entries
                   if label is not None]
        self.current = self._intern(json.dumps(payload, separators=(",", ":"), default=str)) \
            if payload else -1
        hint = next((h for _, _, h in reversed(self._entries) if h is not None), None)
        self.phase_hint = None if hint == NO_PHASE else hint


class Range:
    """One ``tracer.annotate`` range of a session (a context manager)."""

    __slots__ = ("session", "label", "attrs", "entry", "t0")

    def __init__(self, session, label: str, attrs: dict):
        self.session, self.label, self.attrs = session, label, attrs

    def __enter__(self):
        self.t0 = _now()
        self.entry = self.session.open_range(self.label, self.attrs)
        return self

    def __exit__(self, *exc):
        self.session.close_range(self.entry, self.t0)
        return False
