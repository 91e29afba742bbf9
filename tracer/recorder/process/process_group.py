"""A recording session and the process group: its arrival (the rank and world it says: the
trace, status and device files follow the rank; the clocks aligned across ranks, clock.py; the
setup's own event), its end (the clocks aligned again), and the recorder's own collectives,
which run with recording paused (they are the recorder's, not the run's)."""
from __future__ import annotations

import os
import time
from typing import Optional

import torch.distributed as dist

from tracer.vocab import ops
from tracer.vocab.labels import PHASE_OTHER

from .. import rows


def arrived(session, t0: Optional[int] = None) -> None:
    """The process group is initialized (once a session; ``t0``: when its setup began)."""
    if session.pg_seen or not (dist.is_available() and dist.is_initialized()):
        return
    session.pg_seen = True
    rank, world = dist.get_rank(), dist.get_world_size()
    flusher = session.flusher
    with flusher.lock:
        if rank != session.rank and session.is_open:
            old_status = session.status_path
            session.rank = rank
            flusher.rename(session.path)
            if os.path.exists(old_status):
                os.remove(old_status)
        session.rank, session.world_size = rank, world
    flusher.add_meta({"rank": rank, "world_size": world, "backend": str(dist.get_backend())})
    flusher.add_meta(session.clock.at_start(lambda fn, *args: paused_call(session, fn, *args)))
    if session.device is not None:
        session.device.follow_rank(rank)
    if t0 is not None and session.recording:   # the setup's GPU work (NCCL) lands on it
        session.push(rows.record(t0=t0, t1=time.perf_counter_ns(),
                                  op=session.op_ids(ops.OP_PG_INIT), phase=PHASE_OTHER,
                                  step=session.step_index, thread=session.thread_number()))


def departing(session) -> None:
    """The process group is about to be destroyed: the clocks aligned while it still is."""
    if session.is_open and dist.is_initialized():
        aligned_at_end(session)


def aligned_at_end(session) -> None:
    """The clock alignment at the run's end into the trace's metadata."""
    session.flusher.add_meta(
        session.clock.at_end(lambda fn, *args: paused_call(session, fn, *args)))


def paused_call(session, fn, *args):
    """``fn(*args)`` with recording paused: the recorder's own collectives."""
    session.paused += 1
    session.passthrough = True
    try:
        return fn(*args)
    finally:
        session.paused -= 1
        session.passthrough = not session.recording or session.paused > 0
