"""Point-to-point ring of context parallelism: each CP rank sends to the next rank and receives
from the previous one, without waiting, so that the transfer overlaps the attention compute of
the block at hand (Liu et al. 2023, ring attention; Megatron-LM's context parallelism).

Each exchange is posted with batch_isend_irecv: under NCCL a ring of separately posted sends and
receives can deadlock (every rank's send waiting for a receive queued behind its own send);
batched, they are issued together. Gloo matches messages by (peer, tag): every message of one
attention call gets its own tag.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from sample_runs.parallel.process_groups import Group


@dataclass
class PendingExchange:
    works: list
    received: list[torch.Tensor]
    sent: list[torch.Tensor]  # kept alive until the sends complete


class RingExchange:
    """Sends of this CP rank to rank+1, receives from rank-1 (mod c), in group-local order."""

    def __init__(self, group: Group):
        c = group.size
        self.group = group
        self.next = group.ranks[(group.rank + 1) % c]
        self.prev = group.ranks[(group.rank - 1) % c]

    def start(self, tensors: tuple[torch.Tensor, ...], *, tag: int) -> PendingExchange:
        """Post the send of ``tensors`` to the next rank and the receive of as many tensors of
        the same shapes from the previous rank; tags ``tag``, ``tag+1``, ..."""
        sent = [t.contiguous() for t in tensors]
        received = [torch.empty_like(t) for t in sent]
        ops = []
        for i, (out, into) in enumerate(zip(sent, received)):
            ops.append(dist.P2POp(dist.isend, out, self.next, self.group.handle, tag=tag + i))
            ops.append(dist.P2POp(dist.irecv, into, self.prev, self.group.handle, tag=tag + i))
        return PendingExchange(dist.batch_isend_irecv(ops), received, sent)

    @staticmethod
    def wait(pending: PendingExchange) -> list[torch.Tensor]:
        for work in pending.works:
            work.wait()
        return pending.received
