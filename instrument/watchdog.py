"""The hang watchdog of ``trace-run --timeout S``.

It reads the tracer's live status files (``traces/rank-<R>.status.json``, rewritten every
~0.25 s by each rank's flusher thread, even while the rank's main thread is blocked in a
collective). When no rank has made progress (new events, a new step, a status change) for S
seconds while at least one rank waits in a collective, it asks every rank for its Python stacks (SIGUSR1, dumped by faulthandler into
``rank-<R>.stack.txt``), works out which ranks never arrived at the collective the others are
stuck in, and ends the workers (SIGTERM, then SIGKILL: a rank blocked in C++ never runs a Python
signal handler). Its traces stay readable: the tracer flushed them up to the hang.
"""
from __future__ import annotations

import json
import os
import signal
import threading
import time
from dataclasses import dataclass
from typing import Callable, Optional

import tracer
from tracer import rundir

_P2P = ("send", "recv")


@dataclass(frozen=True)
class Collective:
    """One collective launch as the tracer describes it in status files."""

    kind: str
    group: str
    seq: Optional[int]
    peer: Optional[int]

    @classmethod
    def of(cls, d: dict) -> "Collective":
        group = d.get("group")
        if isinstance(group, (list, tuple)):    # status files give lists, traces "0,1" strings
            group = ",".join(map(str, group))
        return cls(d.get("kind"), group, d.get("seq"), d.get("peer"))

    def members(self) -> list:
        """Global ranks of the group; [] if the tracer could not resolve it (``?name``)."""
        if not self.group or self.group.startswith("?"):
            return []
        return [int(r) for r in self.group.split(",")]


def read_statuses(traces_dir: str) -> dict:
    """rank -> the rank's latest status dict (unreadable files are skipped)."""
    statuses = {}
    for rank, path in rundir.rank_files(traces_dir, rundir.STATUS_EXT).items():
        try:
            with open(path) as fh:
                statuses[rank] = json.load(fh)
        except (OSError, ValueError):
            continue
    return statuses


def launched_seqs(traces_dir: str, rank: int) -> dict:
    """group -> highest collective sequence number ``rank`` launched, from its trace on disk."""
    try:
        t = tracer.load(rundir.trace_file(traces_dir, rank))
    except tracer.TraceError:
        return {}
    table = t.table
    groups, seqs = table.column("group").to_pylist(), table.column("seq").to_pylist()
    highest: dict = {}
    for group, seq in zip(groups, seqs):
        if group is not None and seq is not None and seq > highest.get(group, -1):
            highest[group] = seq
    return highest


def never_arrived(statuses: dict, launched: dict, absent_arrived: bool = False) -> list:
    """Ranks that never launched a collective some other rank is stuck in.

    ``statuses``: rank -> status dict; ``launched``: rank -> {group: highest seq launched}
    (from the traces; status files only know the last collective). A rank of the group with no
    status at all never started it either, unless ``absent_arrived`` (multi-node: the ranks of
    other nodes are out of sight, so nothing is known about them).
    """
    def reached(rank: int, c: Collective) -> bool:
        status = statuses.get(rank)
        if status is None:
            return absent_arrived
        seen = [Collective.of(d) for d in status.get("inflight") or []]
        if status.get("last_collective"):
            seen.append(Collective.of(status["last_collective"]))
        highest = launched.get(rank, {}).get(c.group, -1)
        highest = max([highest] + [s.seq for s in seen if s.group == c.group and s.seq is not None])
        return highest >= c.seq

    def posted_peer_op(rank: int, peer: int) -> bool:
        if rank not in statuses:
            return absent_arrived
        status = statuses[rank]
        return any(d.get("kind") in _P2P and d.get("peer") == peer
                   for d in status.get("inflight") or [])

    missing = set()
    for rank, status in statuses.items():
        for d in status.get("inflight") or []:
            c = Collective.of(d)
            if c.kind in _P2P:
                if c.peer is not None and not posted_peer_op(c.peer, rank):
                    missing.add(c.peer)
            elif c.seq is not None:
                missing.update(r for r in c.members() if r != rank and not reached(r, c))
    return sorted(missing)


def _is_child(pid: int) -> bool:
    """A live worker of ours (the agent runs in this process): never signal a stale pid."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state, ppid = fh.read().rsplit(")", 1)[1].split()[:2]
    except (OSError, ValueError, IndexError):
        return False
    return int(ppid) == os.getpid() and state != "Z"


class Watchdog:
    """Background thread: detects a run without progress and ends it (see module docstring)."""

    def __init__(self, traces_dir: str, timeout_s: float, *, poll_s: float = 0.5,
                 multi_node: bool = False, on_hang: Optional[Callable[[dict], None]] = None):
        self.traces_dir = traces_dir
        self.multi_node = multi_node
        self.timeout_s = timeout_s
        self.poll_s = poll_s
        self.on_hang = on_hang
        self.hang: Optional[dict] = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="paratrace-watchdog", daemon=True)

    def start(self) -> "Watchdog":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        last_signature, last_change = None, time.monotonic()
        while not self._stop.wait(self.poll_s):
            statuses = read_statuses(self.traces_dir)
            signature = {r: (s.get("status"), s.get("events"), s.get("last_event_ns"),
                             s.get("step"), len(s.get("inflight") or []))
                         for r, s in statuses.items()}
            if signature != last_signature:
                last_signature, last_change = signature, time.monotonic()
                continue
            running = {r: s for r, s in statuses.items() if not s.get("final")}
            # NOTE: only a rank waiting in a collective makes a hang; a slow start (imports,
            # the tracer's clock sync) changes no status file either.
            waiting = any(s.get("inflight") for s in running.values())
            if waiting and time.monotonic() - last_change >= self.timeout_s:
                self.hang = self._report(statuses, running)
                if self.on_hang is not None:
                    self.on_hang(self.hang)
                self._end(running)
                return

    def _report(self, statuses: dict, running: dict) -> dict:
        pids = {r: s.get("pid") for r, s in running.items() if _is_child(s.get("pid") or -1)}
        for pid in pids.values():
            os.kill(pid, signal.SIGUSR1)
        time.sleep(1.0)     # faulthandler writes at once; leave time for every rank
        launched = {r: launched_seqs(self.traces_dir, r) for r in statuses}
        ranks = {}
        for r, s in sorted(statuses.items()):
            try:
                with open(rundir.stack_file(self.traces_dir, r)) as fh:
                    stack = fh.read()
            except OSError:
                stack = ""
            ranks[str(r)] = {"status": s.get("status"), "step": s.get("step"),
                             "last_collective": s.get("last_collective"),
                             "inflight": s.get("inflight") or [], "stack": stack}
        return {"timeout_s": self.timeout_s,
                "never_arrived": never_arrived(statuses, launched, self.multi_node),
                "ranks": ranks}

    def _end(self, running: dict) -> None:
        # NOTE: ranks waiting in a collective go first: ending a peer first would make their
        # collective fail, which the tracer would record as its completion. Killed while still
        # waiting, the collective stays in flight (t1 null) in the trace, as it really was.
        waiting = [s.get("pid") for s in running.values() if s.get("inflight")]
        others = [s.get("pid") for s in running.values() if not s.get("inflight")]
        _terminate([p for p in waiting if _is_child(p or -1)], grace_s=1.0)
        _terminate([p for p in others if _is_child(p or -1)], grace_s=3.0)


def _terminate(pids: list, grace_s: float) -> None:
    """SIGTERM (the bootstrap turns it into an exception that closes the trace), then SIGKILL
    for ranks blocked in C++, which never run a Python signal handler."""
    for pid in pids:
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_is_child(p) for p in pids):
        time.sleep(0.1)
    for pid in pids:
        if _is_child(pid):
            _signal(pid, signal.SIGKILL)


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass
