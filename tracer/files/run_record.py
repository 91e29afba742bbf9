"""``DIR/run.json``: trace-run's record of how a run went, rank by rank (docs/trace-run.md; the
contract in docs/contract.md): its shape (:class:`RunRecord`), its one writer
(:func:`write`) and its one reader (:func:`read`).

instrument.supervise.run_outcome makes the record from what torch's agent, the watchdog and the
status files said; it holds facts, never sentences (a failed rank's ``failure``:
tracer.vocab.outcomes), worded by viz.views.failures. viz reads it through :func:`read`, which
names the first field it cannot use: a hand-edited or foreign run.json must not crash a report.
"""
from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Optional, TypedDict, cast

from tracer.vocab.outcomes import Failure

from . import rundir
from .status import CollectiveEntry

# /2: a failed rank's outcome is facts ("failure"); /1 held a sentence ("error"), still read
SCHEMA = "paratrace.run/2"
READABLE = ("paratrace.run/1", SCHEMA)


class RunRecordError(ValueError):
    """A run.json that cannot be used; the message is one line naming it."""


class RunTarget(TypedDict):
    """What each worker ran: a script (its absolute path) or a module, and its arguments."""

    script: Optional[str]
    module: Optional[str]
    args: list[str]


class RankOutcome(TypedDict, total=False):
    """How one rank ended. ``status``: tracer.vocab.outcomes.RankStatus; ``failure`` where it
    failed; ``terminated``: ended from outside after another rank failed; ``last_collective``
    and ``tracer_status`` from its status file, where it wrote one; ``error``: the sentence a
    paratrace.run/1 record held instead of ``failure``."""

    status: str
    exit_code: Optional[int]
    failure: Optional[Failure]
    terminated: bool
    last_collective: Optional[CollectiveEntry]
    tracer_status: Optional[str]
    error: Optional[str]


class HangRank(TypedDict):
    """A rank as the watchdog saw it when the run hung: from its status file, and the Python
    stack faulthandler dumped then."""

    status: Optional[str]
    final: bool
    step: Optional[int]
    last_collective: Optional[CollectiveEntry]
    inflight: list[CollectiveEntry]
    stack: str


class Hang(TypedDict):
    """``hang``: the watchdog's rule that saw it (``kind``: tracer.vocab.outcomes.HangRule), the
    ranks it blames (``never_arrived``, else ``lingering``), the ranks whose trace had closed ok
    (``finished``), and each rank's state."""

    timeout_s: float
    exit_grace_s: float
    kind: str
    never_arrived: list[int]
    lingering: list[int]
    finished: list[int]
    ranks: dict[str, HangRank]


class NodeEntry(TypedDict, total=False):
    """``nodes["N"]`` on the collecting node: where node N ran, its ranks, the files it sent
    (none for the collecting node itself)."""

    host: str
    files: list[str]
    ranks: list[int]


class RunRecord(TypedDict, total=False):
    """run.json. trace-run writes every key but ``nodes_missing`` (the collecting node of a
    multi-node run only); a reader takes any of them away (a hand-written record, a directory
    without one: ``{}``)."""

    schema: str
    command: list[str]
    target: RunTarget
    nnodes: int
    node_rank: int
    world_size: int
    started_unix: float
    ended_unix: float
    exit_code: int
    interrupted: bool
    first_failure: Optional[int]
    launch_error: Optional[str]
    ranks: dict[str, RankOutcome]
    hang: Optional[Hang]
    nodes: dict[str, NodeEntry]
    nodes_missing: list[int]


def write(run_dir: str, record: RunRecord) -> str:
    """Write ``DIR/run.json`` atomically (a reader never sees half a record); returns its path.
    Raises OSError."""
    path = os.path.join(run_dir, rundir.RUN_RECORD)
    fd, tmp = tempfile.mkstemp(dir=run_dir, prefix=rundir.RUN_RECORD + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(record, fh, indent=1)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return path


def read(run_dir: str) -> RunRecord:
    """``DIR/run.json``, or ``{}`` where DIR has none (what ``tracer.trace(DIR)`` wrote). Raises
    RunRecordError naming the file and why: not JSON, not an object, another schema, or the
    first field a reader uses whose type is wrong."""
    path = os.path.join(run_dir, rundir.RUN_RECORD)
    if not os.path.exists(path):
        return {}
    try:
        with open(path) as fh:
            record = json.load(fh)
    except (OSError, ValueError) as exc:
        raise RunRecordError(f"{path}: unreadable run record ({exc})") from None
    if not isinstance(record, dict):
        raise RunRecordError(f"{path}: unreadable run record (not a JSON object)")
    wrong = _wrong_field(record)
    if wrong:
        raise RunRecordError(f"{path}: unreadable run record ({wrong})")
    return cast(RunRecord, record)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _rank_keyed(value: object, name: str) -> str:
    """Why ``value`` is not a JSON object of rank -> object, or ''."""
    if not isinstance(value, dict):
        return f"{name} is {type(value).__name__}, not an object keyed by rank"
    for key, entry in value.items():
        if not key.isdigit():
            return f"{name} has the key {key!r}, not a rank"
        if not isinstance(entry, dict):
            return f"{name}[{key!r}] is {type(entry).__name__}, not an object"
    return ""


def _wrong_failure(key: str, failure: object) -> str:
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


def _wrong_field(info: dict[str, Any]) -> str:
    """The first field of run.json a reader uses whose type is wrong, said in a few words; ''
    when they are all usable (a hand-edited or foreign run.json must not crash a report). A
    record without a schema (written by hand) is read; one of another schema is not."""
    schema = info.get("schema")
    if schema is not None and schema not in READABLE:
        return f"schema {schema!r}, not a paratrace.run record ({', '.join(READABLE)})"
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
