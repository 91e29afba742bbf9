"""Rank 1 dies while rank 0 waits in an all_reduce (or, with KIND reduce_scatter, in gloo's
reduce-scatter, whose work has no future and fails in wait()): rank 0's trace must record the
collective as failed (no end time), not completed.
Usage: torchrun --nproc-per-node 2 tracer_peer_dies.py OUT [KIND]"""
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

import tracer



def wait_until_on_disk(path: str) -> None:
    """Until the trace at ``path`` holds an all_reduce: the flusher has written it."""
    while True:
        try:
            if any(r["kind"] == "all_reduce" for r in tracer.load(path).records()):
                return
        except tracer.TraceError:
            pass                        # not written yet
        time.sleep(0.01)


with tracer.trace(sys.argv[1]):
    dist.init_process_group("gloo")
    t = torch.ones(16)
    dist.all_reduce(t)                  # both ranks: completes
    if dist.get_rank() == 1:
        # once its all_reduce is on disk (what the test reads back), whenever the flusher ran,
        # it dies without a word (os._exit would close its trace first:
        # tracer/recorder/process/exits.py)
        wait_until_on_disk(os.path.join(sys.argv[1], "rank-1.arrow"))
        os.kill(os.getpid(), signal.SIGKILL)
    # NOTE: torchrun SIGTERMs the survivors once it sees rank 1 gone; on a loaded machine that
    # could come before rank 0 has seen gloo's error and finished its trace. The test is about
    # what the trace records, so rank 0 finishes on its own.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if sys.argv[2:] == ["reduce_scatter"]:
        dist.reduce_scatter_tensor(torch.zeros(8), t)      # rank 0: the peer is gone
    else:
        dist.all_reduce(t)                                  # rank 0: the peer is gone
