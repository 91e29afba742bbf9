"""How far trace-report and trace-diff got, on the terminal.

:class:`Progress` shows nothing: what library code gets by default, and what the commands use
when stderr is not a terminal (a log file, a pipe, CI). :func:`for_stderr` gives a live
:mod:`rich` progress display on stderr when it is a terminal: one line per phase with a bar
(or a spinner while the amount of work is unknown), the count and the elapsed time. Lines the
commands print to stderr meanwhile (damaged traces) appear above it.
"""
from __future__ import annotations

import sys
import threading
from contextlib import contextmanager
from typing import Iterator, Optional


class Progress:
    """Phases of work and steps within them; this base class shows nothing."""

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        pass

    @contextmanager
    def phase(self, description: str, total: Optional[int] = None) -> Iterator[None]:
        """A phase of ``total`` steps (None: not known yet, see :meth:`expect`)."""
        yield

    def expect(self, steps: int) -> None:
        """``steps`` more steps in the current phase."""

    def advance(self, steps: int = 1) -> None:
        """``steps`` steps of the current phase are done (safe from any thread)."""


class TerminalProgress(Progress):
    """A rich progress display on ``stream`` (a terminal). The bars stay on screen when done,
    so the time each phase took remains readable."""

    def __init__(self, stream=None):
        from rich.console import Console
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress as RichProgress,
                                   SpinnerColumn, TextColumn, TimeElapsedColumn)
        self._bars = RichProgress(
            SpinnerColumn(finished_text="[green]done"), TextColumn("{task.description}"),
            BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            console=Console(file=stream or sys.stderr), transient=False,
            redirect_stdout=False)   # stdout may be a file: the report's path goes there
        self._task = None
        self._lock = threading.Lock()

    def __enter__(self) -> "TerminalProgress":
        self._bars.start()
        return self

    def __exit__(self, *exc) -> None:
        self._bars.stop()

    @contextmanager
    def phase(self, description: str, total: Optional[int] = None) -> Iterator[None]:
        with self._lock:
            self._task = self._bars.add_task(description, total=total)
        try:
            yield
        finally:
            with self._lock:
                task = self._current()
                done = task.total if task.total is not None else task.completed
                self._bars.update(self._task, total=done or 1, completed=done or 1)
                self._task = None

    def expect(self, steps: int) -> None:
        with self._lock:
            if self._task is not None:
                self._bars.update(self._task, total=(self._current().total or 0) + steps)

    def advance(self, steps: int = 1) -> None:
        with self._lock:
            if self._task is not None:
                self._bars.advance(self._task, steps)

    def _current(self):
        return next(t for t in self._bars.tasks if t.id == self._task)


def for_stderr() -> Progress:
    """A live display when stderr is a terminal, else one that shows nothing."""
    try:
        interactive = sys.stderr.isatty()
    except (AttributeError, ValueError):
        interactive = False
    return TerminalProgress() if interactive else Progress()
