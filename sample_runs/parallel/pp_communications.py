"""Point-to-point messages between pipeline stages: activations downstream, gradients upstream.

NOTE on deadlocks: sends are posted with isend and only waited for at the end of the
iteration, receives are posted just before the pass that needs them and waited at once. A
rank therefore only ever blocks on data it truly depends on, so any schedule whose order
respects the data dependencies (all in tracer.vocab.schedules do) cannot deadlock, whatever the
other ranks are doing. Gloo matches messages by (peer, tag), and every message of an
iteration gets its own tag. NCCL ignores tags and matches per channel in order; activations and
gradients travel on two different groups, so each directed channel carries one kind of message,
and all schedules here produce and consume each kind in the same order on both ends.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from sample_runs.parallel.process_groups import Group


class PipeChannels:
    """Sends and receives of one pipeline rank over its PP groups."""

    def __init__(self, activations: Group, gradients: Group, device: torch.device):
        self.activations, self.gradients, self.device = activations, gradients, device
        self._pending: list[tuple[dist.Work, torch.Tensor]] = []

    def send(self, tensor: torch.Tensor, *, stage: int, tag: int, grad: bool) -> None:
        """Post a send of ``tensor`` to pipeline rank ``stage``; waited in ``wait_sends``."""
        group = self.gradients if grad else self.activations
        tensor = tensor.detach().contiguous()
        work = dist.isend(tensor, dst=group.ranks[stage], group=group.handle, tag=tag)
        self._pending.append((work, tensor))

    def recv(self, shape: tuple[int, ...], *, stage: int, tag: int, grad: bool) -> torch.Tensor:
        """Receive a float tensor of ``shape`` from pipeline rank ``stage``."""
        group = self.gradients if grad else self.activations
        buffer = torch.empty(shape, dtype=torch.float32, device=self.device)
        dist.irecv(buffer, src=group.ranks[stage], group=group.handle, tag=tag).wait()
        return buffer

    def wait_sends(self) -> None:
        for work, _ in self._pending:
            work.wait()
        self._pending.clear()
