"""Clock alignment: each rank's offset to rank 0's monotonic clock, through the process group.

Rank 0 plays ping-pong with every other rank in turn (NTP's method): rank r sends its time t1,
rank 0 answers with its time t2 on receipt, rank r reads t3 on the reply. Then
``offset = t2 - (t1 + t3) / 2`` and the error is at most ``(t3 - t1) / 2``; of several rounds the
one with the smallest round trip is kept. ``local + offset`` is rank 0's clock.

Ranks on one node share CLOCK_MONOTONIC, so their offsets come out near zero; across nodes the
offsets are what aligns the timelines. Runs at start (when the process group appears) and at end
(before it is destroyed), so the reader can correct linear drift.
"""
from __future__ import annotations

import datetime
import time
from dataclasses import asdict, dataclass
from typing import Optional

import torch
import torch.distributed as dist

ROUNDS = 8


@dataclass
class ClockEstimate:
    at_ns: int          # local time of the estimate
    offset_ns: int      # add to a local time to get rank 0's time
    error_ns: int       # half the best round trip: the offset is exact within +- error
    method: str

    def to_json(self) -> dict:
        return asdict(self)


def estimate_offset(timeout_s: float = 30.0, rounds: int = ROUNDS) -> Optional[ClockEstimate]:
    """Collective over the default group: every rank must call it. None if it failed or timed out."""
    if not dist.is_available() or not dist.is_initialized():
        return None
    rank, world = dist.get_rank(), dist.get_world_size()
    now = time.perf_counter_ns
    if world == 1:
        return ClockEstimate(now(), 0, 0, "single-rank")
    device = torch.device("cpu")
    if dist.get_backend() == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    timeout = datetime.timedelta(seconds=timeout_s)
    buf = torch.zeros(1, dtype=torch.int64, device=device)
    tag = 7321

    def send(value: int, peer: int) -> None:
        buf.fill_(value)
        dist.isend(buf, peer, tag=tag).wait(timeout)

    def recv(peer: int) -> int:
        dist.irecv(buf, peer, tag=tag).wait(timeout)
        return int(buf.item())

    try:
        if rank == 0:
            for peer in range(1, world):
                for _ in range(rounds):
                    recv(peer)
                    send(now(), peer)
            return ClockEstimate(now(), 0, 0, "reference")
        best = None
        for _ in range(rounds):
            t1 = now()
            send(t1, 0)
            t2 = recv(0)
            t3 = now()
            if best is None or t3 - t1 < best[2] - best[0]:
                best = (t1, t2, t3)
        t1, t2, t3 = best
        return ClockEstimate(t3, t2 - (t1 + t3) // 2, (t3 - t1) // 2, "ping-pong")
    except Exception:   # a rank that died or never came: alignment stays unknown, not fatal
        return None


class ClockAlignment:
    """Runs :func:`estimate_offset` once when the process group appears and once before it goes
    (or at the end of recording), and says what to add to the trace's metadata."""

    def __init__(self, enabled: bool, timeout_s: float):
        self.enabled = enabled
        self.timeout_s = timeout_s
        self._started = False
        self._ended = False

    def at_start(self, run) -> dict:
        """``run(fn, *args)`` calls fn with recording paused (the estimate's own messages are
        not the user's). Returns the metadata update: ``clock_start``, or nothing."""
        if not self.enabled or self._started:
            return {}
        self._started = True
        estimate = run(estimate_offset, self.timeout_s)
        return {"clock_start": estimate.to_json() if estimate else None}

    def at_end(self, run) -> dict:
        """Metadata update ``clock_end``, once, and only after a start estimate."""
        if not self.enabled or self._ended or not self._started:
            return {}
        self._ended = True
        estimate = run(estimate_offset, self.timeout_s)
        return {"clock_end": estimate.to_json() if estimate else None}
