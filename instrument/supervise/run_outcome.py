"""How a trace-run went, rank by rank: the content of ``DIR/run.json`` (its shape, writer and
reader: tracer.files.run_record; schema in docs/trace-run.md).

:class:`Outcome` is what torch's agent and the watchdog said about the launch; :func:`new_record`
turns it, with the tracer's status files, into the record; :func:`merge_uploads` adds what other
nodes sent; :func:`root_cause` picks the rank that failed first across nodes. The record holds
facts, never sentences: a failed rank's ``failure`` (tracer.vocab.outcomes) is worded by
viz.views.failures, for the terminal, the report and summary.json alike; nothing here imports
viz (it runs beside the workers).
"""
from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, TypedDict

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

import tracer
from tracer.files import run_record, rundir
from tracer.files.run_record import Hang, RankOutcome, RunRecord, RunTarget
from tracer.files.status import Status, read_statuses
from tracer.vocab.outcomes import (Bystander, Failure, FailureKind, HangRule, RankStatus, Site,
                                   TraceStatus, failure, hang_blamed)

from .gather import NodeRecord, Upload
from .watchdog import Collective, P2P, highest_seqs

EXIT_HANG = 124         # trace-run's exit status after a hang (as coreutils' timeout)
# Exit codes of workers ended from outside (SIGTERM/SIGINT/SIGKILL by the agent or watchdog).
_ENDED = {-signal.SIGTERM, -signal.SIGINT, -signal.SIGKILL, 128 + signal.SIGTERM,
          128 + signal.SIGINT}


class LeftEarly(TypedDict):
    """A rank that left through os._exit or sys.exit while others waited for it: its exit code
    and its ``exited`` failure."""

    code: Optional[int]
    failure: Failure


@dataclass
class Outcome:
    """How the launch ended, from torch's agent and the watchdog."""

    exit_code: int = 0
    interrupted: bool = False
    ranks: dict[str, RankOutcome] = field(default_factory=dict)     # by rank, "R"
    first_failure: Optional[int] = None
    hang: Optional[Hang] = None
    error: Optional[str] = None                    # the launch itself failed (rendezvous...)

    def add_failures(self, failed: ChildFailedError, traces_dir: str) -> None:
        """torch's ChildFailedError: every failed rank, the first one and the exit status. A
        rank that left through os._exit or sys.exit while a failed rank waited for it counts
        as failed too, whatever its exit status (torch's agent saw a 0 as a success)."""
        left = left_early(traces_dir, read_statuses(traces_dir), set(failed.failures))
        first = first_to_stop(sorted(set(failed.failures) | set(left)), traces_dir)
        if first is None:
            first, _ = failed.get_first_failure()
        self.first_failure = first
        code = failed.failures[first].exitcode if first in failed.failures else \
            left[first]["code"]
        self.exit_code = exit_status(code or 0)     # an exit entry without a code: failed
        for rank, reported in failed.failures.items():
            self.ranks[str(rank)] = failed_rank(rank, reported, first)
        for rank, how in left.items():
            self.ranks[str(rank)] = {"status": RankStatus.FAILED, "exit_code": how["code"],
                                     "failure": how["failure"], "terminated": False}

    def add_hang(self, hang: Hang, exit_code: int) -> None:
        """The watchdog ended the run: blame the ranks it named; the others were ended."""
        self.hang, self.exit_code = hang, exit_code
        culprits = hang_blamed(hang)
        self.first_failure = culprits[0] if culprits else None
        for rank, info in self.ranks.items():
            seen: Mapping[str, Any] = hang["ranks"].get(rank) or {}
            blamed = int(rank) in culprits
            finished = seen.get("final") and seen.get("status") == TraceStatus.OK
            cause = hang.get("kind", HangRule.COLLECTIVE) if blamed else \
                Bystander.FINISHED if finished else Bystander.WAITING
            info.update({"failure": failure(FailureKind.HANG, ranks=culprits, cause=cause,
                                            timeout_s=hang["timeout_s"]),
                         "terminated": not blamed})


def left_early(traces_dir: str, statuses: dict[int, Status], failed: set[int]
               ) -> dict[int, LeftEarly]:
    """rank -> {"code", "failure"} of each rank whose trace says it left through os._exit or
    sys.exit (tracer/recorder/process/exits.py) while a failed rank waited for it in a collective it
    never launched (an ``exited`` failure: how it left, the ranks that waited, the collective they
    waited in, its step). A rank that left after its last collective (a script that ends with
    os._exit(0)) is no such rank. Reads the traces of the ranks waited for only."""
    waited: dict[int, list[tuple[int, Collective]]] = {}
    for rank in sorted(failed):
        status: Status = statuses.get(rank) or {}
        for d in (status.get("failed_collectives") or []) + (status.get("inflight") or []):
            c = Collective.of(d)
            members = [c.peer] if c.kind in P2P else c.members()
            for other in members:
                if other is not None and other != rank:
                    waited.setdefault(other, []).append((rank, c))
    out: dict[int, LeftEarly] = {}
    for rank, waits in waited.items():
        mine: Status = statuses.get(rank) or {}
        if not mine.get("final") or mine.get("failed_collectives"):
            continue              # killed, or a waiter itself: it left through no exit call
        try:
            trace = tracer.load(rundir.trace_file(traces_dir, rank))
        except tracer.TraceError:
            continue
        how = trace.meta.get("exit")
        if not isinstance(how, dict):
            continue
        launched = highest_seqs(trace)
        missed = [(w, c) for w, c in waits
                  if c.kind in P2P or c.seq is None or c.group is None
                  or launched.get(c.group, -1) < c.seq]
        if missed:
            c = missed[0][1]
            site: Site = {"kind": c.kind, "group": c.group, "seq": c.seq, "peer": c.peer}
            out[rank] = {"code": how.get("code"), "failure": failure(
                FailureKind.EXITED, ranks={w for w, _ in missed}, cause=how.get("how"),
                site=site, step=how.get("step"))}
    return out


def first_to_stop(ranks: list[int], traces_dir: str) -> Optional[int]:
    """Of these failed ranks, the one whose last sign of life came first: the root cause, as
    the others stopped because of it. A rank's last sign of life is its status file's last
    write, as the time it wrote in it (``now_ns``: the machine's monotonic clock, to the
    nanosecond, the same for every rank of a node) where every rank has one; else the latest
    modification time of its status file or its trace; None unless every rank has one of them.

    NOTE: torch's own first failure compares whole seconds, taken from the error file of a rank
    that raised but from the moment the agent noticed a rank killed by a signal: a peer that
    raised "connection closed" a moment after a SIGKILL can come out first. A status file is
    rewritten every 0.25 s while a rank lives and once more when its trace closes, and the trace
    at every flush. The trace counts too because it exists from the rank's first moment of
    recording, while the first status file waits for the flusher's first turn: a rank killed
    before that turn (a starved flusher on a loaded machine) leaves no status file, and asking
    torch instead can blame its peer.
    NOTE: modification times come from the kernel's coarse clock (a tick of some
    milliseconds): a killed rank's last write and its peer's final one could tie, and a tie
    went to whichever rank came first in torch's list (the flaky
    test_a_rank_killed_with_sigkill_mid_step blamed rank 1 once). The status file's own time
    cannot tie, and orders them as they happened: the killed rank wrote its last before it
    died, the peer its final one after it saw the death.
    """
    statuses = read_statuses(traces_dir)
    written = {r: ns for r in ranks if isinstance(ns := (statuses.get(r) or {}).get("now_ns"), int)}
    if ranks and len(written) == len(ranks):
        return min(ranks, key=written.__getitem__)
    stopped: dict[int, float] = {}
    for rank in ranks:
        times = []
        for path in (rundir.status_file(traces_dir, rank), rundir.trace_file(traces_dir, rank)):
            try:
                times.append(os.path.getmtime(path))
            except OSError:
                continue
        if not times:
            return None
        stopped[rank] = max(times)
    return min(stopped, key=stopped.__getitem__) if stopped else None


def exit_status(code: int) -> int:
    """A worker's exit code as a shell would report it (killed by signal N: 128 + N)."""
    return 128 - code if code < 0 else (code or 1)


def failed_rank(rank: int, reported: ProcessFailure, first: int) -> RankOutcome:
    """run.json entry of a rank torch's agent reported failed (``reported``: its
    ProcessFailure); ``terminated``: a bystander the launcher ended because rank ``first``
    failed. Its cause is the message torch gave (what it raised, the signal that ended it), none
    when torch's error file has none (the exit code says it)."""
    message: object = reported.message
    if isinstance(message, dict):          # torch's error file: {"message": ..., "extraInfo"}
        message = message.get("message")
    if not message or str(message).startswith("To enable traceback"):
        message = None
    terminated = rank != first and reported.exitcode in _ENDED
    cause = None if message is None else str(message)
    return {"status": RankStatus.FAILED, "exit_code": reported.exitcode, "terminated": terminated,
            "failure": failure(FailureKind.ENDED, ranks=[first], cause=cause) if terminated else
            failure(FailureKind.ERROR, cause=cause)}


def local_ranks(outcome: Outcome, traces_dir: str, remote: set[int]) -> dict[str, RankOutcome]:
    """Every rank this node ran: the agent's results plus ranks that wrote a status file
    (``remote``: ranks other nodes uploaded into the same directory)."""
    ranks = {rank: info.copy() for rank, info in outcome.ranks.items()}
    for rank, status in read_statuses(traces_dir).items():
        if rank in remote and str(rank) not in ranks:
            continue
        reported = str(rank) in ranks
        entry = ranks.setdefault(str(rank), {"status": RankStatus.FAILED, "exit_code": None,
                                             "failure": None})
        entry["last_collective"] = status.get("last_collective")
        entry["tracer_status"] = status.get("status")
        if not reported:
            # not reported by the agent: the run ended early (hang, Ctrl-C, launch error)
            entry["status"] = RankStatus.OK if status.get("status") == TraceStatus.OK else \
                RankStatus.FAILED
            if entry["status"] == RankStatus.FAILED:
                entry["failure"] = ended_early(outcome)
    return _by_rank(ranks)


def ended_early(outcome: Outcome) -> Optional[Failure]:
    """The failure of a rank torch's agent did not report: the run ended before it could."""
    if outcome.interrupted:
        return failure(FailureKind.INTERRUPTED)
    if outcome.hang:
        return failure(FailureKind.HANG, ranks=hang_blamed(outcome.hang),
                       timeout_s=outcome.hang["timeout_s"])
    return failure(FailureKind.LAUNCH, cause=outcome.error) if outcome.error else None


def new_record(*, command: list[str], target: RunTarget, node: NodeRecord, world_size: int,
               started: float, outcome: Outcome, ranks: dict[str, RankOutcome]) -> RunRecord:
    """The record of this node's part of the run."""
    return {
        "schema": run_record.SCHEMA, "command": command, "target": target,
        "nnodes": node["group_world_size"], "node_rank": node["group_rank"],
        "world_size": world_size, "started_unix": started, "ended_unix": time.time(),
        "exit_code": outcome.exit_code, "interrupted": outcome.interrupted,
        "first_failure": outcome.first_failure, "launch_error": outcome.error,
        "ranks": ranks, "hang": outcome.hang, "nodes": {},
    }


def merge_uploads(record: RunRecord, uploads: dict[int, Upload], node: NodeRecord, host: str
                  ) -> None:
    """The collecting node's record: its own ranks plus every other node's upload."""
    own = sorted(map(int, record["ranks"]))
    for upload in uploads.values():
        record["ranks"].update(upload.ranks)
        record["nodes"][str(upload.node_rank)] = {"host": upload.peer, "files": upload.files,
                                                  "ranks": sorted(map(int, upload.ranks))}
    record["ranks"] = _by_rank(record["ranks"])
    record["nodes"][str(node["group_rank"])] = {"host": host, "ranks": own}
    record["nodes_missing"] = [n for n in range(node["group_world_size"])
                               if str(n) not in record["nodes"]]


def root_cause(ranks: dict[str, RankOutcome], traces_dir: str, fallback: Optional[int]
               ) -> Optional[int]:
    """Across nodes, the failed rank whose tracer closed first (its trace's ``end_unix``).

    Each node's agent only knows its own ranks: when a rank on node 1 raises, node 0's ranks
    fail a moment later with "connection closed by peer", and node 0's first failure is that.
    """
    ended: dict[int, float] = {}
    for rank, info in ranks.items():
        if info.get("status") != RankStatus.FAILED or info.get("terminated"):
            continue
        try:
            end = tracer.load(rundir.trace_file(traces_dir, int(rank))).meta.get("end_unix")
        except tracer.TraceError:
            continue
        if end is not None:
            ended[int(rank)] = end
    return min(ended, key=ended.__getitem__) if ended else fallback


def _by_rank(ranks: dict[str, RankOutcome]) -> dict[str, RankOutcome]:
    return dict(sorted(ranks.items(), key=lambda kv: int(kv[0])))
