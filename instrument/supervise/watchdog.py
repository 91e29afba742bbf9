"""The hang watchdog of ``trace-run --timeout S``: when a run hangs, and what to do about it.

It judges from the tracer's live status files (``traces/rank-<R>.status.json``, rewritten every
~0.25 s by each rank's flusher thread, even while the rank's main thread is blocked in a
collective). :class:`HangDetector` calls two situations a hang:

- **a hung collective**: no rank has made progress (new events, a new step, a status change) for
  S seconds while at least one rank waits in a collective;
- **a rank left behind**: some rank has finished (its trace closed ``ok``), and a rank whose
  process still runs has recorded nothing for S seconds since (it hangs outside any collective,
  or closed its trace but never exits). torch's agent would wait for it for ever.

A slow start (imports, rendezvous, the tracer's clock sync) is neither: nobody waits in a
collective yet and nobody has finished. On a hang, :func:`hang_report` asks every live rank for
its Python stacks (SIGUSR1, dumped by faulthandler into ``rank-<R>.stack.txt``) and works out
which ranks never arrived at the collective the others are stuck in; :func:`end_workers` ends
them (SIGTERM, then SIGKILL: a rank blocked in C++ never runs a Python signal handler). Their
traces stay readable: the tracer flushed them up to the hang. What it finds are facts
(run.json's ``hang``; their vocabulary: tracer.vocab.outcomes): trace-run words them once the
workers have ended (viz.views.failures), and nothing here imports viz.
"""
from __future__ import annotations

import signal
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

import tracer
from tracer.files import rundir
from tracer.files.reader import Trace
from tracer.files.run_record import Hang, HangRank
from tracer.files.status import Status, read_statuses
from tracer.vocab.groups import group_ranks
from tracer.vocab.ops import P2P_KINDS as P2P
from tracer.vocab.outcomes import HangRule, TraceStatus

from .processes import is_child, live_children, send_signal, terminate

EXIT_GRACE_S = 30.0       # a closed trace, a live process: torch's own shutdown grace


@dataclass(frozen=True)
class Collective:
    """One collective launch as the tracer describes it in status files."""

    kind: Optional[str]
    group: Optional[str]
    seq: Optional[int]
    peer: Optional[int]

    @classmethod
    def of(cls, d: Mapping[str, Any]) -> Collective:
        group = d.get("group")
        if isinstance(group, (list, tuple)):    # status files give lists, traces "0,1" strings
            group = ",".join(map(str, group))
        return cls(d.get("kind"), group, d.get("seq"), d.get("peer"))

    def members(self) -> list[int]:
        """Global ranks of the group; [] if the tracer could not resolve it (``?name``)."""
        return list(group_ranks(self.group))


def launched_seqs(traces_dir: str, rank: int) -> dict[str, int]:
    """group -> highest collective sequence number ``rank`` launched, from its trace on disk."""
    try:
        return highest_seqs(tracer.load(rundir.trace_file(traces_dir, rank)))
    except tracer.TraceError:
        return {}


def highest_seqs(trace: Trace) -> dict[str, int]:
    """group -> highest collective sequence number launched in ``trace``."""
    table = trace.table
    groups, seqs = table.column("group").to_pylist(), table.column("seq").to_pylist()
    kinds = table.column("kind").to_pylist()
    highest: dict[str, int] = {}
    for group, seq, kind in zip(groups, seqs, kinds):
        # point-to-point operations have sequence numbers of their own
        if group is not None and seq is not None and kind not in P2P \
                and seq > highest.get(group, -1):
            highest[group] = seq
    return highest


def never_arrived(statuses: dict[int, Status], launched: dict[int, dict[str, int]],
                  absent_arrived: bool = False) -> list[int]:
    """Ranks that never launched a collective some other rank is stuck in.

    ``statuses``: rank -> status dict; ``launched``: rank -> {group: highest seq launched}
    (from the traces; status files only know the last collective). A rank of the group with no
    status at all never started it either, unless ``absent_arrived`` (multi-node: the ranks of
    other nodes are out of sight, so nothing is known about them).
    """
    def reached(rank: int, c: Collective) -> bool:      # c: a collective with a seq
        status = statuses.get(rank)
        if status is None:
            return absent_arrived
        seen = [Collective.of(d) for d in status.get("inflight") or []]
        last = status.get("last_collective")
        if last:
            seen.append(Collective.of(last))
        highest = launched.get(rank, {}).get(c.group, -1) if c.group is not None else -1
        highest = max([highest] + [s.seq for s in seen if s.group == c.group
                                    and s.seq is not None and s.kind not in P2P])
        return highest >= (c.seq or 0)

    def posted_peer_op(rank: int, peer: int) -> bool:
        if rank not in statuses:
            return absent_arrived
        status = statuses[rank]
        return any(d.get("kind") in P2P and d.get("peer") == peer
                   for d in status.get("inflight") or [])

    missing = set()
    for rank, status in statuses.items():
        for d in status.get("inflight") or []:
            c = Collective.of(d)
            if c.kind in P2P:
                if c.peer is not None and not posted_peer_op(c.peer, rank):
                    missing.add(c.peer)
            elif c.seq is not None:
                missing.update(r for r in c.members() if r != rank and not reached(r, c))
    return sorted(missing)


@dataclass
class Verdict:
    """A hang: which rule saw it (``kind``), the ranks to blame for a rank left behind or a rank
    that does not exit (``lingering``), and the ranks whose trace had closed ``ok``."""

    kind: HangRule
    lingering: list[int] = field(default_factory=list)
    finished: list[int] = field(default_factory=list)


def progress_signature(status: Status) -> tuple[object, ...]:
    """What changes whenever a rank makes progress (``now_ns`` changes at every rewrite)."""
    return (status.get("status"), status.get("events"), status.get("last_event_ns"),
            status.get("step"), len(status.get("inflight") or []), status.get("final"))


class HangDetector:
    """Decides from successive snapshots of the status files whether the run hangs (see the
    module docstring). Pure: the caller passes the time and which ranks' processes are alive."""

    def __init__(self, timeout_s: float, exit_grace_s: float = EXIT_GRACE_S):
        self.timeout_s = timeout_s
        self.exit_grace_s = max(timeout_s, exit_grace_s)
        self._signature: Optional[dict[int, tuple[object, ...]]] = None
        self._quiet_since = 0.0                   # no rank changed since
        # rank -> (signature, when it last changed)
        self._changed: dict[int, tuple[tuple[object, ...], float]] = {}
        self._finished_at: dict[int, float] = {}     # rank -> when its trace was first seen ok

    def observe(self, statuses: dict[int, Status], alive: set[int], now: float
                ) -> Optional[Verdict]:
        """``statuses``: rank -> status dict; ``alive``: ranks whose process still runs."""
        signature = {r: progress_signature(s) for r, s in statuses.items()}
        if signature != self._signature:
            self._signature, self._quiet_since = signature, now
        for rank, sig in signature.items():
            if self._changed.get(rank, (None,))[0] != sig:
                self._changed[rank] = (sig, now)
            if statuses[rank].get("final") and statuses[rank].get("status") == TraceStatus.OK:
                self._finished_at.setdefault(rank, now)
        finished = sorted(self._finished_at)
        running = {r: s for r, s in statuses.items() if not s.get("final")}
        # NOTE: a rank in a collective is what makes silence a hang; a slow start changes no
        # status file either, but then nobody waits yet.
        if any(s.get("inflight") for s in running.values()) and \
                now - self._quiet_since >= self.timeout_s:
            return Verdict(HangRule.COLLECTIVE, finished=finished)
        behind = [r for r in sorted(alive & set(running)) if self._left_behind(r, now)]
        if behind:
            return Verdict(HangRule.LEFT_BEHIND, lingering=behind, finished=finished)
        stuck = [r for r in sorted(alive & set(self._finished_at))
                 if now - self._finished_at[r] >= self.exit_grace_s]
        if stuck:
            return Verdict(HangRule.EXIT, lingering=stuck, finished=finished)
        return None

    def _left_behind(self, rank: int, now: float) -> bool:
        """Silent for the timeout since the later of its last change and the first time another
        rank was seen finished."""
        if not self._finished_at:
            return False
        since = max(self._changed[rank][1], min(self._finished_at.values()))
        return now - since >= self.timeout_s


def hang_report(traces_dir: str, verdict: Verdict, detector: HangDetector, *,
                multi_node: bool = False) -> Hang:
    """``run.json["hang"]``: the rule that saw it, the ranks it blames, those whose trace had
    closed ok (``finished``), each rank's state and Python stack (dumped now, on SIGUSR1)."""
    statuses = read_statuses(traces_dir)
    for rank, s in statuses.items():
        if is_child(s.get("pid") or -1):
            send_signal(s["pid"], signal.SIGUSR1)
    time.sleep(1.0)     # faulthandler writes at once; leave time for every rank
    statuses = read_statuses(traces_dir)
    launched = {r: launched_seqs(traces_dir, r) for r in statuses}
    ranks: dict[str, HangRank] = {}
    for r, s in sorted(statuses.items()):
        try:
            with open(rundir.stack_file(traces_dir, r)) as fh:
                stack = fh.read()
        except OSError:
            stack = ""
        ranks[str(r)] = {"status": s.get("status"), "final": bool(s.get("final")),
                         "step": s.get("step"), "last_collective": s.get("last_collective"),
                         "inflight": s.get("inflight") or [], "stack": stack}
    never = never_arrived(statuses, launched, multi_node) \
        if verdict.kind == HangRule.COLLECTIVE else []
    return {"timeout_s": detector.timeout_s, "exit_grace_s": detector.exit_grace_s,
            "kind": verdict.kind, "never_arrived": never, "lingering": verdict.lingering,
            "finished": verdict.finished, "ranks": ranks}


def end_workers(traces_dir: str) -> None:
    """End this node's live workers that are still recording; a worker whose trace is closed is
    ended only when none is recording (otherwise torch's agent ends it, and it may exit first)."""
    # NOTE: ranks waiting in a collective go first: ending a peer first would make their
    # collective fail, which the tracer would record as its completion. Killed while still
    # waiting, the collective stays in flight (t1 null) in the trace, as it really was.
    statuses = [s for s in read_statuses(traces_dir).values() if is_child(s.get("pid") or -1)]
    recording = [s for s in statuses if not s.get("final")]
    waiting = [s["pid"] for s in recording if s.get("inflight")]
    others = [s["pid"] for s in (recording or statuses) if s["pid"] not in waiting]
    # SIGTERM (the bootstrap turns it into an exception that closes the trace), then SIGKILL
    # for ranks blocked in C++, which never run a Python signal handler
    terminate(live_children(waiting), grace_s=1.0, reap_them=False)
    terminate(live_children(others), grace_s=3.0, reap_them=False)


def alive_ranks(statuses: dict[int, Status]) -> set[int]:
    """Ranks whose worker process (the status file's pid) still runs."""
    return {r for r, s in statuses.items() if is_child(s.get("pid") or -1)}
