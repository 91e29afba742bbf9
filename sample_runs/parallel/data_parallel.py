"""Data parallelism: bucketed gradient all-reduce overlapped with the backward pass.

As in PyTorch DDP and Megatron's DistributedDataParallel, parameters are grouped into buckets
in reverse order of creation (roughly the order their gradients become final). A
post-accumulate-grad hook counts the accumulations of each parameter; when a parameter has
received its last one of the iteration (one per micro-batch, so the hooks act once per
iteration even under pipelining) it is ready, and a bucket whose parameters are all ready is
pre-scaled by 1/d and all-reduced asynchronously. ``finish`` waits before the optimizer step.
The bucketing and readiness bookkeeping (GradBuckets) is shared with ZeRO (zero.py), whose
buckets are reduce-scattered instead.
"""
from __future__ import annotations

from typing import Iterable, Optional

import torch
import torch.distributed as dist
from torch import nn

import tracer
from sample_runs.parallel.process_groups import Group


def partition_buckets(params: list[nn.Parameter], bucket_numel: int,
                      alone: Iterable[nn.Parameter] = ()) -> list[list[nn.Parameter]]:
    """Buckets of about ``bucket_numel`` elements, filled in reverse parameter order; each
    parameter in ``alone`` gets a bucket of its own (Megatron does so for the tied embedding,
    so that its shard lines up on the first and last pipeline stage)."""
    alone_ids = {id(p) for p in alone}
    buckets: list[list[nn.Parameter]] = [[]]
    for param in reversed(params):
        single = id(param) in alone_ids
        full = sum(p.numel() for p in buckets[-1]) >= bucket_numel
        last_alone = len(buckets[-1]) == 1 and id(buckets[-1][0]) in alone_ids
        if buckets[-1] and (full or single or last_alone):
            buckets.append([])
        buckets[-1].append(param)
    return buckets


class GradBuckets:
    """Launches each bucket's reduction once all its parameters have their last gradient
    accumulation of the iteration, in bucket order (every rank of the group issues the same
    sequence of collectives). Subclasses say how a bucket is reduced (``_launch``)."""

    def __init__(self, buckets: list[list[nn.Parameter]], *, accumulations: int):
        self.buckets, self.accumulations = buckets, accumulations
        self._bucket_of = {id(p): i for i, bucket in enumerate(self.buckets) for p in bucket}
        self._reset()
        for bucket in self.buckets:
            for param in bucket:
                param.register_post_accumulate_grad_hook(self.grad_ready)

    def _reset(self) -> None:
        self._counts: dict[int, int] = {}
        self._ready = [0] * len(self.buckets)
        self._next = 0

    def grad_ready(self, param: nn.Parameter) -> None:
        """Count one accumulation into ``param.grad``; launch buckets that became complete.
        Registered as a hook and also called by W passes, which bypass autograd."""
        count = self._counts.get(id(param), 0) + 1
        self._counts[id(param)] = count
        if count == self.accumulations:
            self._ready[self._bucket_of[id(param)]] += 1
            while self._next < len(self.buckets) and \
                    self._ready[self._next] == len(self.buckets[self._next]):
                with tracer.annotate("grad-sync"):
                    self._launch(self._next)
                self._next += 1

    def _launch(self, index: int) -> None:
        raise NotImplementedError

    def _check_all_launched(self) -> None:
        if self._next != len(self.buckets):
            raise RuntimeError(f"gradient buckets {self._next}..{len(self.buckets) - 1} "
                               "never became ready: a gradient missed its last accumulation")


class BucketedGradReducer(GradBuckets):
    """Averages gradients over the DP group in buckets launched from gradient hooks.

    ``scale`` pre-multiplies each bucket (default 1/d, an average); expert weights, whose
    gradients already sum the tokens of the EP group, pass 1/(the whole DP size)."""

    def __init__(self, params: list[nn.Parameter], group: Group, *, bucket_numel: int,
                 accumulations: int, scale: Optional[float] = None):
        self.group = group
        self.scale = 1.0 / group.size if scale is None else scale
        self._in_flight: list[tuple[Optional[dist.Work], torch.Tensor, list[nn.Parameter]]] = []
        super().__init__(partition_buckets(params, bucket_numel), accumulations=accumulations)

    def _launch(self, index: int) -> None:
        bucket = self.buckets[index]
        flat = torch.cat([p.grad.reshape(-1) for p in bucket]).mul_(self.scale)
        work = None
        if self.group.size > 1:
            work = dist.all_reduce(flat, group=self.group.handle, async_op=True)
        self._in_flight.append((work, flat, bucket))

    def finish(self) -> None:
        """Wait for every bucket and write the averaged gradients back."""
        self._check_all_launched()
        for work, flat, bucket in self._in_flight:
            if work is not None:
                work.wait()
            for param, chunk in zip(bucket, flat.split([p.numel() for p in bucket])):
                param.grad.copy_(chunk.view_as(param))
        self._in_flight.clear()
        self._reset()
