"""ZeRO stages 1 and 2 (Rajbhandari et al. 2020), as Megatron's distributed optimizer.

Gradients are bucketed as in plain DP (data_parallel.GradBuckets: launched from gradient hooks
at each parameter's last accumulation of the iteration), but each bucket is reduce-scattered
instead of all-reduced: DP rank r receives the sum of slice r of every rank's bucket, P/d
elements. AdamW steps only that slice of the parameters (its state, exp_avg and exp_avg_sq, is
1/d of plain DP's), and the step ends with an all-gather of the updated slices into every rank's
full parameters. Traffic per bucket: reduce-scatter (d-1)/d P + all-gather (d-1)/d P, the same
as one ring all-reduce of P.

ZeRO-1 keeps the full local gradients (Megatron keeps its gradient buffer); ZeRO-2 drops them as
soon as the bucket's reduce-scatter is launched and keeps only the reduced shard (gradient
memory / d). With fp32 training the optimizer's slice is a copy of the parameters' slice; under
mixed precision it would be the fp32 master copy, which plain DP also keeps in full.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Optional, Union

import torch
import torch.distributed as dist
from torch import nn

import tracer
from sample_runs.parallel.data_parallel import GradBuckets, partition_buckets
from sample_runs.parallel.process_groups import Group
from sample_runs.parallel.tp_communications import wait
from sample_runs.parallel.zero_communications import (
    FlatLayout, start_all_gather, start_reduce_scatter)

if TYPE_CHECKING:
    from sample_runs.parallel.zero3 import ShardedParameters


class ShardedGradReducer(GradBuckets):
    """Reduce-scatters gradient buckets over the DP group into this rank's shard of each."""

    def __init__(self, params: list[nn.Parameter], group: Group, *, bucket_numel: int,
                 accumulations: int, keep_full_grads: bool,
                 alone: Iterable[nn.Parameter] = ()):
        buckets = partition_buckets(params, bucket_numel, alone)
        self.group, self.keep_full_grads, self.model_params = group, keep_full_grads, params
        self.layouts = [FlatLayout(bucket, group) for bucket in buckets]
        # The slice of the parameters this rank updates (Megatron's "main params" shard).
        self.main_shards = [
            nn.Parameter(layout.flatten([p.detach() for p in bucket])[layout.lo:layout.hi].clone())
            for layout, bucket in zip(self.layouts, buckets)]
        self._in_flight: list[tuple[Optional[dist.Work], torch.Tensor, torch.Tensor, int]] = []
        super().__init__(buckets, accumulations=accumulations)

    def _launch(self, index: int) -> None:
        layout = self.layouts[index]
        flat = layout.flatten([p.grad for p in layout.params]).mul_(1.0 / self.group.size)
        shard, work = start_reduce_scatter(flat, self.group)  # (P,) -> (P/d,)
        if not self.keep_full_grads:  # ZeRO-2: only the reduced shard survives
            for param in layout.params:
                param.grad = None
        self._in_flight.append((work, flat, shard, index))

    def finish(self) -> None:
        """Wait for every reduce-scatter; the shards become the optimizer's gradients."""
        self._check_all_launched()
        for work, _, shard, index in self._in_flight:
            wait(work)
            self.main_shards[index].grad = shard
        self._in_flight.clear()
        self._reset()

    def shard_grads(self) -> list[tuple[FlatLayout, torch.Tensor]]:
        return [(layout, shard.grad) for layout, shard in zip(self.layouts, self.main_shards)]

    @torch.no_grad()
    def after_optimizer_step(self) -> None:
        """All-gather the updated slices into every rank's full parameters."""
        with tracer.annotate("param-gather"):
            gathers = [start_all_gather(shard.detach(), self.group) for shard in self.main_shards]
            for layout, (full, work) in zip(self.layouts, gathers):
                wait(work)
                for param, value in zip(layout.params, layout.unflatten(full)):
                    param.copy_(value)


class ShardedAdamW(torch.optim.AdamW):
    """AdamW over this rank's shards (ZeRO-1/2/3). Its step ends with the sharding's
    ``after_optimizer_step`` (the ZeRO-1/2 parameter all-gather), inside the one optimizer step
    that profilers and paratrace see; ``zero_grad`` also clears the model's full gradients."""

    def __init__(self, sharded: Union[ShardedGradReducer, "ShardedParameters"], **adamw):
        super().__init__(sharded.main_shards, **adamw)
        self.sharded = sharded

    def step(self, closure=None):
        loss = super().step(closure)
        self.sharded.after_optimizer_step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none=set_to_none)
        for param in self.sharded.model_params:
            param.grad = None
