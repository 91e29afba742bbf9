"""What trace-run says while the workers run: phase lines on stderr, step progress, and the
hang watchdog, all fed by one thread that reads the tracer's live status files; the same
thread ends what finished or dead ranks forked (orphans.Strays). A hang is kept as facts
(:attr:`Monitor.hang`, run.json's ``hang``): trace-run words it once the workers have ended
(viz.views.failures), as nothing that runs beside the workers imports viz.

Every line trace-run prints on stderr starts with ``trace-run:`` (:func:`say`); stdout is kept
for the training's own output and, last, the report's path.
"""
from __future__ import annotations

import sys
import threading
import time
from typing import Callable, Optional

from tracer.files.run_record import Hang
from tracer.files.status import Status, read_statuses

from . import watchdog
from .orphans import Strays
from .watchdog import HangDetector

POLL_S = 0.5
STEP_LINE_INTERVAL_S = 1.0


def say(message: str) -> None:
    """One line of trace-run's own on stderr."""
    print(f"trace-run: {message}", file=sys.stderr, flush=True)


class StepProgress:
    """``recorded k steps`` (``k/N steps`` when the script recorded its number of steps with
    ``tracer.record_config(steps=N)``), printed when the slowest rank advances, at most once
    per ``interval_s``. ``k`` counts the steps the slowest rank completed, as a script counts
    them from 1, so the line never runs ahead of, nor reads a step behind, the script's own
    ``step k`` line; nothing is said before the first step ends."""

    def __init__(self, ranks: int, emit: Callable[[str], None],
                 interval_s: float = STEP_LINE_INTERVAL_S):
        self.ranks = ranks               # this node's ranks: the slowest is known once all report
        self.emit = emit
        self.interval_s = interval_s
        self.shown: Optional[int] = None
        self._shown_at = float("-inf")

    def observe(self, statuses: dict[int, Status], now: float, final: bool = False
                ) -> Optional[str]:
        """The line to print for this snapshot of the status files, if any (and prints it);
        ``final``: the last snapshot, shown however soon after the previous line."""
        if len(statuses) < self.ranks or (now - self._shown_at < self.interval_s and not final):
            return None
        steps = [k for s in statuses.values() if isinstance(k := s.get("step"), int)]
        if not steps or len(steps) < len(statuses):
            return None
        slowest = min(steps)
        if slowest < 1 or (self.shown is not None and slowest <= self.shown):
            return None
        self.shown, self._shown_at = slowest, now
        total = total_steps(statuses)
        line = f"recorded {slowest}" + (f"/{total}" if total else "") + \
            (" step" if slowest == 1 and not total else " steps")
        self.emit(line)
        return line


def total_steps(statuses: dict[int, Status]) -> Optional[int]:
    """``steps`` of the configuration a rank recorded (status key ``config``), if any."""
    for status in statuses.values():
        config = status.get("config")
        steps = config.get("steps") if isinstance(config, dict) else None
        if isinstance(steps, int) and not isinstance(steps, bool) and steps > 0:
            return steps
    return None


class Monitor:
    """Background thread over ``traces_dir``: step lines always; with ``timeout_s``, the hang
    watchdog (on a hang: its report in :attr:`hang`, the workers ended; the caller says it)."""

    def __init__(self, traces_dir: str, *, ranks: int, timeout_s: Optional[float],
                 multi_node: bool = False, poll_s: float = POLL_S):
        self.traces_dir = traces_dir
        self.timeout_s = timeout_s
        self.multi_node = multi_node
        self.poll_s = poll_s
        self.progress = StepProgress(ranks, say)
        self.detector = HangDetector(timeout_s) if timeout_s else None
        self.hang: Optional[Hang] = None
        self.strays = Strays()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="paratrace-monitor", daemon=True)

    def start(self) -> "Monitor":
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop watching; unless the run hung, say the step the slowest rank ended at."""
        self._stop.set()
        self._thread.join(timeout=60)
        if self.hang is None:
            self.progress.observe(read_statuses(self.traces_dir), time.monotonic(), final=True)

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            self.strays.tick()
            statuses = read_statuses(self.traces_dir)
            now = time.monotonic()
            self.progress.observe(statuses, now)
            if self.detector is None:
                continue
            verdict = self.detector.observe(statuses, watchdog.alive_ranks(statuses), now)
            if verdict is not None:
                self.hang = watchdog.hang_report(self.traces_dir, verdict, self.detector,
                                                 multi_node=self.multi_node)
                watchdog.end_workers(self.traces_dir)
                return
