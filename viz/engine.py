"""Where the per-rank map of the analysis runs: in this process, in local worker processes
(``trace-report --jobs N``), or on a Dask cluster (``trace-report --dask ADDRESS``).

Each task is a top-level function of viz.analysis.rank applied to one rank's trace file; it
returns a small result (the cross-rank part never needs a trace). A task that finds its trace
unreadable returns the error's one-line text instead of raising, so one bad file leaves the other
ranks' results intact. Dask workers must see the trace files at the same paths (a shared
filesystem) and run the same paratrace. No scheduler is written here: concurrent.futures and
dask.distributed do the scheduling. """
from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from typing import Callable, Optional

from tracer.files.format import TraceError

from .run import RunError

# Below this much trace data a pool costs more (starting workers, importing viz) than it saves.
POOL_MIN_BYTES = 16 << 20
DASK_TIMEOUT_S = 10


class EngineError(RunError):
    """The engine could not run (a Dask scheduler out of reach, dask not installed)."""


def guarded(fn: Callable, *args):
    """Run one task: its result, or ``TraceError(text)`` when the trace was unreadable."""
    try:
        return fn(*args)
    except TraceError as exc:
        return TraceError(str(exc))


class Engine:
    """Maps tasks over ranks. ``jobs``: worker processes (1: this process); ``dask``: the
    address of a Dask scheduler (tcp://host:port), which takes precedence."""

    def __init__(self, jobs: Optional[int] = None, dask: Optional[str] = None):
        self.jobs = max(1, jobs if jobs is not None else (os.cpu_count() or 1))
        self.chosen = jobs is not None     # the user's number is kept, small run or not
        self.dask = dask
        self._pool = None
        self._client = None

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        if self._pool is not None:
            self._pool.shutdown()
        if self._client is not None:
            self._client.close()

    def describe(self) -> str:
        if self.dask:
            return f"dask scheduler {self.dask}"
        return f"{self.jobs} worker processes" if self.jobs > 1 else "this process"

    def plan(self, files: dict) -> None:
        """Unless told how many, run small runs in this process: a pool would cost more than
        it saves."""
        if not (self.dask or self.chosen) and \
                sum(_size(p) for p in files.values()) < POOL_MIN_BYTES:
            self.jobs = 1

    def map(self, fn: Callable, tasks: list, then: Optional[Callable] = None) -> list:
        """``[then(guarded(fn, *args)) for args in tasks]``, wherever the engine runs them;
        ``then`` (default: none) runs in this process on each result as it is taken, in task
        order (from Dask, once all are gathered), so what the results hold all together can
        shrink as they come in."""
        then = then or _same
        if self.dask:
            client = self._dask_client()
            futures = client.map(guarded, [fn] * len(tasks), *zip(*tasks), pure=False)
            return [then(result) for result in client.gather(futures)]
        if self.jobs == 1 or len(tasks) == 1:
            return [then(guarded(fn, *args)) for args in tasks]
        if self._pool is None:
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload(["viz.analysis.rank"])
            self._pool = ProcessPoolExecutor(max_workers=min(self.jobs, len(tasks)),
                                             mp_context=context)
        return [then(result) for result in self._pool.map(guarded, [fn] * len(tasks),
                                                          *zip(*tasks))]

    def _dask_client(self):
        if self._client is None:
            try:
                from dask.distributed import Client
            except ImportError:
                raise EngineError("--dask needs dask.distributed: pip install "
                                  "'paratrace[dask]'") from None
            try:
                self._client = Client(self.dask, timeout=DASK_TIMEOUT_S)
            except ValueError as exc:             # dask's own address parsing
                raise EngineError(f"--dask {self.dask}: not a scheduler address "
                                  f"({_first_line(exc)}; e.g. tcp://host:8786)") from None
            except (OSError, TimeoutError) as exc:
                raise EngineError(f"--dask {self.dask}: no scheduler answered "
                                  f"({_first_line(exc)})") from None
        return self._client


def _first_line(exc: Exception) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _same(result):
    return result


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
