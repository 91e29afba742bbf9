"""A run directory: where its traces are and what trace-run recorded about the run.

A run directory (``trace-run --out DIR``) holds ``DIR/traces/rank-<R>.arrow`` (one per rank),
their live status files, and ``DIR/run.json`` (written by trace-run: command, exit codes, each
rank's failure as facts, hang report); a bare directory of ``rank-<R>.arrow`` files (what
``tracer.trace(dir)`` writes) opens too (file names: :mod:`tracer.files.rundir`). Opening a run
reads no trace: analyses load one rank's trace at a time (:mod:`viz.analysis`), so a run of
many ranks never sits in memory whole.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

from tracer.files import rundir
from tracer.files.reader import Trace, load


class RunError(Exception):
    """A run directory that cannot be used; the message is one line naming it."""


@dataclass
class Run:
    """The trace files of one run, and its run.json."""

    dir: str
    traces_dir: str
    files: dict                                     # rank -> trace file path
    info: dict = field(default_factory=dict)        # run.json, {} when absent

    def load(self, rank: int) -> Trace:
        """Read one rank's trace. Raises tracer.TraceError (one line naming the file)."""
        return load(self.files[rank])


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _rank_keyed(value, name: str) -> str:
    """Why ``value`` is not a JSON object of rank -> object, or ''."""
    if not isinstance(value, dict):
        return f"{name} is {type(value).__name__}, not an object keyed by rank"
    for key, entry in value.items():
        if not key.isdigit():
            return f"{name} has the key {key!r}, not a rank"
        if not isinstance(entry, dict):
            return f"{name}[{key!r}] is {type(entry).__name__}, not an object"
    return ""


def _wrong_failure(key: str, failure) -> str:
    """Why a rank's ``failure`` (tracer.vocab.outcomes) cannot be worded, or ''."""
    where = f"ranks[{key!r}].failure"
    if failure is None:
        return ""
    if not isinstance(failure, dict):
        return f"{where} is {type(failure).__name__}, not an object"
    if not isinstance(failure.get("kind"), str):
        return f"{where}.kind is {failure.get('kind')!r}, not a string"
    ranks = failure.get("ranks")
    if ranks is not None and not (isinstance(ranks, list) and all(map(_is_int, ranks))):
        return f"{where}.ranks is {ranks!r}, not a list of ranks"
    for name, kind, what in (("cause", str, "a string"), ("site", dict, "an object")):
        if failure.get(name) is not None and not isinstance(failure[name], kind):
            return f"{where}.{name} is {failure[name]!r}, not {what}"
    return ""


def _wrong_field(info: dict) -> str:
    """The first field of run.json the report reads whose type is wrong, said in a few words;
    '' when they are all usable (a hand-edited or foreign run.json must not crash a report)."""
    size = info.get("world_size")
    if size is not None and not (_is_int(size) and size >= 1):
        return f"world_size is {size!r}, not a positive integer"
    if info.get("exit_code") is not None and not _is_int(info["exit_code"]):
        return f"exit_code is {info['exit_code']!r}, not an integer"
    command = info.get("command")
    if command is not None and not isinstance(command, (str, list)):
        return f"command is {type(command).__name__}, not a string or a list"
    if info.get("ranks") is not None:
        wrong = _rank_keyed(info["ranks"], "ranks")
        if wrong:
            return wrong
        for key, entry in info["ranks"].items():
            code = entry.get("exit_code")
            if code is not None and not _is_int(code):
                return f"ranks[{key!r}].exit_code is {code!r}, not an integer"
            for text in ("status", "error"):
                if entry.get(text) is not None and not isinstance(entry[text], str):
                    return f"ranks[{key!r}].{text} is {entry[text]!r}, not a string"
            wrong = _wrong_failure(key, entry.get("failure"))
            if wrong:
                return wrong
    hang = info.get("hang")
    if hang is not None:
        if not isinstance(hang, dict):
            return f"hang is {type(hang).__name__}, not an object"
        if hang.get("ranks") is not None:
            wrong = _rank_keyed(hang["ranks"], "hang.ranks")
            if wrong:
                return wrong
        for key in ("never_arrived", "lingering", "finished"):
            ranks = hang.get(key)
            if ranks is not None and not (isinstance(ranks, list) and all(map(_is_int, ranks))):
                return f"hang.{key} is {ranks!r}, not a list of ranks"
    return ""


def open_run(path: str) -> Run:
    """Open a run directory. Raises RunError if it is not one or holds no trace file."""
    if not os.path.isdir(path):
        raise RunError(f"{path}: not a directory" if os.path.exists(path)
                       else f"{path}: no such run directory")
    sub = os.path.join(path, rundir.TRACES)
    if os.path.exists(sub) and not os.path.isdir(sub):
        raise RunError(f"{sub}: not a directory (a run's traces go there)")
    traces_dir = rundir.traces_dir(path)
    try:
        files = rundir.rank_files(traces_dir)
    except OSError as exc:
        raise RunError(f"{traces_dir}: cannot list the traces ({exc.strerror})") from None
    info = {}
    info_path = os.path.join(path, rundir.RUN_RECORD)
    if os.path.exists(info_path):
        try:
            with open(info_path) as fh:
                info = json.load(fh)
        except (OSError, ValueError) as exc:
            raise RunError(f"{info_path}: unreadable run record ({exc})") from None
        if not isinstance(info, dict):
            raise RunError(f"{info_path}: unreadable run record (not a JSON object)")
        wrong = _wrong_field(info)
        if wrong:
            raise RunError(f"{info_path}: unreadable run record ({wrong})")
    if not files:
        raise RunError(f"{path}: no trace files (rank-<R>.arrow) found")
    # absolute: worker processes and Dask workers open the files from directories of their own
    return Run(os.path.abspath(path), os.path.abspath(traces_dir),
               {rank: os.path.abspath(file) for rank, file in sorted(files.items())}, info)
