"""``trace-report --kineto [R=]FILE...|DIR``: which torch.profiler exports, and whose rank each is.

One export per rank: the same file given twice (by two names or two links), or two files for
one rank, is refused in one line before anything is read, so no GPU time is ever counted
twice. A directory stands for the exports in it (``*.json``, ``*.json.gz``). An export's
rank is the one given (``R=FILE``), else its ``distributedInfo.rank`` (read from the head of
the file, not its events), else, for a recording of one rank or an export given alone, the
only rank there is. Errors are :class:`tracer.kineto.chrome_trace.KinetoError`, one line naming the
argument.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Optional, Protocol

from .chrome_trace import KinetoError, export_head, rank_of


EXPORT_SUFFIXES = (".json", ".json.gz")


@dataclass
class ExportArg:
    """One export on the command line."""

    path: str
    rank: Optional[int]          # given, or found in its head; None: not known yet


class RunFiles(Protocol):
    """A recording's traces (viz.run.Run) that exports merge into."""

    dir: str
    files: dict[int, str]                   # rank -> trace file


def parse_entries(entries: list[str]) -> list[ExportArg]:
    """``[R=]FILE`` and ``DIR`` arguments -> one ExportArg per file, each file once."""
    out: list[ExportArg] = []
    seen: dict[tuple[int, int], str] = {}    # (device, inode) -> the file's path as given
    for entry in entries:
        head, sep, tail = entry.partition("=")
        path, rank = (tail, int(head)) if sep and head.isdigit() else (entry, None)
        items: list[tuple[str, Optional[int]]]
        if os.path.isdir(path):
            if rank is not None:
                raise KinetoError(f"--kineto {entry}: a directory, not one rank's export")
            found = sorted(os.path.join(path, n) for n in os.listdir(path)
                           if n.endswith(EXPORT_SUFFIXES)
                           and os.path.isfile(os.path.join(path, n)))
            if not found:
                raise KinetoError(f"--kineto {path}: no torch.profiler exports (*.json, "
                               "*.json.gz) in it")
            items = [(p, None) for p in found]
        elif os.path.isfile(path):
            items = [(path, rank)]
        else:
            raise KinetoError(f"--kineto {path}: no such file")
        for p, r in items:
            st = os.stat(p)
            key = (st.st_dev, st.st_ino)
            if key in seen:
                same = "" if seen[key] == p else f" (the same file as {seen[key]})"
                raise KinetoError(f"--kineto {p}: given twice{same}: each export is read once")
            seen[key] = p
            out.append(ExportArg(p, r))
    return out


def read_heads(exports: list[ExportArg]) -> dict[str, str]:
    """Fill each export's rank from its head where none was given; returns path -> one-line
    error of the files that are no export at all."""
    bad = {}
    for export in exports:
        try:
            top = export_head(export.path)
        except KinetoError as exc:
            bad[export.path] = str(exc)
            continue
        if export.rank is None:
            export.rank = rank_of(top)
    return bad


def one_per_rank(exports: list[ExportArg]) -> None:
    """Refuse two exports for one rank."""
    owner: dict[int, str] = {}
    for export in exports:
        if export.rank is None:
            continue
        if export.rank in owner:
            raise KinetoError(f"--kineto {export.path}: rank {export.rank} has two exports "
                           f"({owner[export.rank]} and {export.path}): give one export per "
                           "rank (R=FILE names a file's rank)")
        owner[export.rank] = export.path


def merge_ranks(entries: list[str], run: RunFiles) -> dict[int, list[str]]:
    """rank -> [export] to merge into a recording's ranks (``trace-report RUN --kineto``)."""
    exports = parse_entries(entries)
    bad = read_heads(exports)
    if bad:
        raise KinetoError(next(iter(bad.values())))
    out: dict[int, list[str]] = {}
    for export in exports:
        rank = export.rank
        if rank is None:
            if len(run.files) != 1:
                raise KinetoError(f"--kineto {export.path}: the export does not say its rank "
                               f"(distributedInfo.rank) and the run has {len(run.files)} "
                               f"ranks: give it as R={export.path}")
            rank = export.rank = next(iter(run.files))
        if rank not in run.files:
            raise KinetoError(f"--kineto {export.path}: rank {rank} has no trace in "
                           f"{run.dir}")
        out[rank] = [export.path]
    one_per_rank(exports)
    return out
