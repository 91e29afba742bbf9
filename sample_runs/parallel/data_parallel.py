"""Data parallelism: bucketed gradient all-reduce overlapped with the backward pass.

As in PyTorch DDP and Megatron's DistributedDataParallel, parameters are grouped into buckets
in reverse order of creation (roughly the order their gradients become final). A
post-accumulate-grad hook counts the accumulations of each parameter; when a parameter has
received its last one of the iteration (one per micro-batch, so the hooks act once per
iteration even under pipelining) it is ready, and a bucket whose parameters are all ready is
pre-scaled by 1/d and all-reduced asynchronously. ``finish`` waits before the optimizer step.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

import tracer
from sample_runs.parallel.process_groups import Group


class BucketedGradReducer:
    """Averages gradients over the DP group in buckets launched from gradient hooks."""

    def __init__(self, params: list[nn.Parameter], group: Group, *, bucket_numel: int,
                 accumulations: int):
        self.group, self.accumulations = group, accumulations
        self.buckets: list[list[nn.Parameter]] = [[]]
        for param in reversed(params):
            if self.buckets[-1] and sum(p.numel() for p in self.buckets[-1]) >= bucket_numel:
                self.buckets.append([])
            self.buckets[-1].append(param)
        self._bucket_of = {id(p): i for i, bucket in enumerate(self.buckets) for p in bucket}
        self._reset()
        for param in params:
            param.register_post_accumulate_grad_hook(self.grad_ready)

    def _reset(self) -> None:
        self._counts: dict[int, int] = {}
        self._ready = [0] * len(self.buckets)
        self._next = 0  # buckets launch in order, so every DP rank issues the same sequence
        self._in_flight: list[tuple[dist.Work, torch.Tensor, list[nn.Parameter]]] = []

    def grad_ready(self, param: nn.Parameter) -> None:
        """Count one accumulation into ``param.grad``; launch buckets that became complete.
        Registered as a hook and also called by W passes, which bypass autograd."""
        count = self._counts.get(id(param), 0) + 1
        self._counts[id(param)] = count
        if count == self.accumulations:
            self._ready[self._bucket_of[id(param)]] += 1
            while self._next < len(self.buckets) and \
                    self._ready[self._next] == len(self.buckets[self._next]):
                self._launch(self._next)

    def _launch(self, index: int) -> None:
        bucket = self.buckets[index]
        with tracer.annotate("grad-sync"):
            flat = torch.cat([p.grad.reshape(-1) for p in bucket]).mul_(1.0 / self.group.size)
            work = dist.all_reduce(flat, group=self.group.handle, async_op=True)
        self._in_flight.append((work, flat, bucket))
        self._next = index + 1

    def finish(self) -> None:
        """Wait for every bucket and write the averaged gradients back."""
        if self._next != len(self.buckets):
            raise RuntimeError(f"data-parallel buckets {self._next}..{len(self.buckets) - 1} "
                               "never became ready: a gradient missed its last accumulation")
        for work, flat, bucket in self._in_flight:
            work.wait()
            for param, chunk in zip(bucket, flat.split([p.numel() for p in bucket])):
                param.grad.copy_(chunk.view_as(param))
        self._reset()
