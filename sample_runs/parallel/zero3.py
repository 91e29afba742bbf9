"""ZeRO stage 3 (Rajbhandari et al. 2020; PyTorch FSDP's FULL_SHARD): parameters sharded too.

The model is cut into units: each transformer block, and the rest of a pipeline chunk
(embeddings, final LayerNorm, LM head) as the chunk's root unit, as FSDP wraps a root. A unit
keeps only this rank's shard of its flat buffers (zero_communications.FlatLayout). Its full
parameters are all-gathered right before its forward and freed right after; gathered again
right before its backward (a hook on the gradient of its output) and freed once every parameter
of the unit has accumulated its gradient. At the unit's last accumulation of the iteration its
gradients are reduce-scattered into the shard and the full gradients dropped. AdamW steps the
shards; nothing is gathered after the step: the next forward does it.

Traffic per iteration with one micro-batch: all-gather of P before forward, again before
backward, reduce-scatter of P: 3 x (d-1)/d P, 1.5x plain DP's all-reduce. With m micro-batches
the gathers repeat per micro-batch (the reduce-scatter stays once per iteration).

Freeing: the parameters are views of the unit's flat buffer (``param.data``), whose storage is
resized to zero bytes and back, as FSDP1 does: the references autograd saves for backward stay
valid and see the gathered values again when the backward runs.
"""
from __future__ import annotations

from typing import Iterable, Optional

import torch
import torch.distributed as dist
from torch import nn

import tracer
from sample_runs.parallel.process_groups import Group
from sample_runs.parallel.tp_communications import wait
from sample_runs.parallel.zero_communications import (
    FlatLayout, start_all_gather, start_reduce_scatter)


class _Unit:
    """The parameters gathered and freed together, in one or more flat buffers."""

    def __init__(self, params: list[nn.Parameter], group: Group, alone: set[int]):
        self.params = params
        flats = [[p] for p in params if id(p) in alone]
        rest = [p for p in params if id(p) not in alone]
        self.layouts = [FlatLayout(ps, group) for ps in flats + ([rest] if rest else [])]
        self.full: list[torch.Tensor] = []
        self.main_shards: list[nn.Parameter] = []
        for layout in self.layouts:
            full = layout.flatten([p.detach() for p in layout.params])  # (P,)
            self.main_shards.append(nn.Parameter(full[layout.lo:layout.hi].clone()))  # (P/d,)
            for param, view in zip(layout.params, layout.unflatten(full)):
                param.data = view
            self.full.append(full)
        self.gathered = True
        self.accumulated = 0

    @torch.no_grad()
    def gather(self) -> None:
        if self.gathered:
            return
        with tracer.annotate("param-gather"):
            works = []
            for full, shard, layout in zip(self.full, self.main_shards, self.layouts):
                full.untyped_storage().resize_(full.numel() * full.element_size())
                works.append(start_all_gather(shard.detach(), layout.group, out=full)[1])
            for work in works:
                wait(work)
        self.gathered = True

    def free(self) -> None:
        for full in self.full:
            full.untyped_storage().resize_(0)
        self.gathered = False


class ShardedParameters:
    """ZeRO-3 over ``group`` for the chunks of this rank; ``alone`` parameters (the tied
    embedding) get a flat buffer of their own so their shards line up across stages."""

    def __init__(self, chunks: list[nn.Module], group: Group, *, accumulations: int,
                 alone: Iterable[nn.Parameter] = ()):
        self.group, self.accumulations = group, accumulations
        alone_ids = {id(p) for p in alone}
        self.units: list[_Unit] = []
        for chunk in chunks:
            for block in chunk.blocks.values():
                self._wrap(block, list(block.parameters()), alone_ids)
            root = [p for name, p in chunk.named_parameters() if not name.startswith("blocks.")]
            if root:
                self._wrap(chunk, root, alone_ids)
        self.model_params = [p for unit in self.units for p in unit.params]
        self.main_shards = [s for unit in self.units for s in unit.main_shards]
        self._in_flight: list[tuple[Optional[dist.Work], torch.Tensor, torch.Tensor,
                                    nn.Parameter]] = []
        for unit in self.units:
            unit.free()

    def _wrap(self, module: nn.Module, params: list[nn.Parameter], alone: set[int]) -> None:
        unit = _Unit(params, self.group, alone)
        self.units.append(unit)
        module.register_forward_pre_hook(lambda mod, args: unit.gather())
        module.register_forward_hook(lambda mod, args, out: self._after_forward(unit, out))
        for param in params:
            param.register_post_accumulate_grad_hook(lambda p: self._grad_accumulated(unit))

    def _after_forward(self, unit: _Unit, output: torch.Tensor) -> None:
        unit.free()
        if output.requires_grad:  # gather again right before this unit's backward
            output.register_hook(lambda grad: unit.gather())

    def _grad_accumulated(self, unit: _Unit) -> None:
        unit.accumulated += 1
        if unit.accumulated % len(unit.params) == 0:  # this micro-batch's backward is done
            unit.free()
        if unit.accumulated == len(unit.params) * self.accumulations:
            with tracer.annotate("grad-sync"):
                self._reduce_scatter(unit)

    def _reduce_scatter(self, unit: _Unit) -> None:
        for layout, shard in zip(unit.layouts, unit.main_shards):
            flat = layout.flatten([p.grad for p in layout.params]).mul_(1.0 / self.group.size)
            reduced, work = start_reduce_scatter(flat, self.group)  # (P,) -> (P/d,)
            self._in_flight.append((work, flat, reduced, shard))
            for param in layout.params:
                param.grad = None

    def finish(self) -> None:
        """Wait for every reduce-scatter; the shards become the optimizer's gradients."""
        incomplete = [u for u in self.units
                      if u.accumulated != len(u.params) * self.accumulations]
        if incomplete:
            raise RuntimeError(f"{len(incomplete)} ZeRO-3 units missed gradient accumulations")
        for work, _, reduced, shard in self._in_flight:
            wait(work)
            shard.grad = reduced
        self._in_flight.clear()
        for unit in self.units:
            unit.accumulated = 0

    def shard_grads(self) -> list[tuple[FlatLayout, torch.Tensor]]:
        return [(layout, shard.grad) for unit in self.units
                for layout, shard in zip(unit.layouts, unit.main_shards)]

    def after_optimizer_step(self) -> None:
        """Nothing to gather: the next forward gathers each unit's updated parameters."""
