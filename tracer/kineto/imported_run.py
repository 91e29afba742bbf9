"""A run made of torch.profiler exports alone: ``trace-report OUT --kineto FILE...|DIR``.

Each export is converted once into paratrace's own trace files in ``OUT/traces``
(:func:`tracer.kineto.convert.import_export`, one export per task on the
:class:`viz.engine.Engine`: this process, worker processes or Dask), and the run is then
analysed like any recording; a later ``trace-report OUT`` reads the converted traces without
the exports. A file that is no export is named in one line and left out, the others are
analysed; an export damaged partway is used as far as it reads (its line is kept in its trace
and shown with the report). Exports write to temporary names first: only once every rank is
known, and known once, do they become ``rank-<R>.arrow``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Protocol

from tracer.files import rundir
from tracer.files.format import META_KEY, TraceError

from .chrome_trace import KinetoError
from .convert import Imported, import_export
from .inputs import one_per_rank, parse_entries, read_heads

_TEMP = ".kineto-import-"


@dataclass
class ImportResult:
    """What importing the exports gave: the traces written, the files left out."""

    traces_dir: str
    imported: list[Imported] = field(default_factory=list)
    left_out: list[str] = field(default_factory=list)   # one line per file that is no export


class ImportEngine(Protocol):
    """Where the imports run (viz.engine.Engine): one task per export."""

    def plan(self, files: dict[int, str]) -> None: ...

    def map(self, fn: Callable[..., Any], tasks: list[tuple[Any, ...]]) -> list[Any]: ...


def is_imported_run(path: str) -> bool:
    """Whether ``path`` holds traces and every one was imported from an export (so a new
    ``--kineto`` replaces them rather than merging into them)."""
    import json

    import pyarrow as pa
    files = rundir.rank_files(rundir.traces_dir(path)) if os.path.isdir(path) else {}
    if not files:
        return False
    for trace in files.values():
        try:
            with pa.memory_map(trace, "r") as source:
                meta = json.loads((pa.ipc.open_stream(source).schema.metadata or {})
                                  .get(META_KEY, b"{}"))
        except (OSError, ValueError, pa.ArrowInvalid):
            return False
        if not isinstance(meta, dict) or "imported" not in meta:
            return False
    return True


def has_traces(path: str) -> bool:
    return os.path.isdir(path) and bool(rundir.rank_files(rundir.traces_dir(path)))


def import_exports(run_dir: str, entries: list[str], engine: ImportEngine,
                   limit: Optional[int] = None) -> ImportResult:
    """Import the exports ``entries`` name into ``run_dir/traces`` (see the module
    docstring). Raises KinetoError (one line) when none can be used or ranks collide."""
    exports = parse_entries(entries)
    bad = read_heads(exports)
    one_per_rank(exports)
    good = [e for e in exports if e.path not in bad]
    if not good:
        raise KinetoError(f"no usable torch.profiler export: {next(iter(bad.values()))}")
    traces = os.path.join(run_dir, rundir.TRACES)
    _fresh(traces)
    engine.plan({k: e.path for k, e in enumerate(good)})
    results = engine.map(import_export, [(e.path, traces, f"{_TEMP}{k}", e.rank, limit)
                                         for k, e in enumerate(good)])
    out = ImportResult(traces, left_out=list(bad.values()))
    done: list[Imported] = []
    for export, result in zip(good, results):
        if isinstance(result, TraceError):
            out.left_out.append(str(result))
        else:
            done.append(result)
    try:
        _assign_ranks(done)
    except KinetoError:
        _remove(done)
        raise
    if not done:
        raise KinetoError("no usable torch.profiler export: " + "; ".join(out.left_out))
    for item in done:
        _rename(item, traces)
    out.imported = done
    return out


def _assign_ranks(done: list[Imported]) -> None:
    """Every import's rank: its own, or 0 for an export given alone; one export a rank."""
    unknown = [d for d in done if d.rank is None]
    if unknown and len(done) > 1:
        raise KinetoError(f"--kineto {unknown[0].export}: the export does not say its rank "
                       f"(distributedInfo.rank): give it as R={unknown[0].export}")
    owner: dict[int, str] = {}
    for d in done:
        if d.rank is None:                  # given alone
            d.rank = 0
        if d.rank in owner:
            raise KinetoError(f"--kineto {d.export}: rank {d.rank} has two exports "
                           f"({owner[d.rank]} and {d.export}): give one export per rank")
        owner[d.rank] = d.export


def _fresh(traces: str) -> None:
    """An empty traces directory: traces imported before are replaced, never merged into."""
    os.makedirs(traces, exist_ok=True)
    for name in os.listdir(traces):
        if name.startswith(_TEMP) or rundir.parse_rank_file(name) is not None \
                or name.endswith(".device.arrow"):
            os.remove(os.path.join(traces, name))


def _rename(item: Imported, traces: str) -> None:
    assert item.rank is not None, "ranks are assigned before"
    trace = os.path.join(traces, rundir.rank_file(item.rank))
    os.replace(item.trace, trace)
    item.trace = trace
    if item.device:
        device = rundir.device_file(traces, item.rank)
        os.replace(item.device, device)
        item.device = device


def _remove(done: list[Imported]) -> None:
    for item in done:
        for path in (item.trace, item.device):
            if path and os.path.exists(path):
                os.remove(path)
