"""Pipeline parallelism: run one rank's schedule (tracer.vocab.schedules) over its model chunks.

Chunk c of pipeline rank r is virtual stage c*p + r (Megatron's interleaved assignment); the
first virtual stage embeds tokens, the last computes the loss. Every pass is annotated for the
tracer as "F", "B" or "W" with its micro-batch and chunk.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

import tracer
from sample_runs.model import GPTChunk
from sample_runs.parallel.pp_communications import PipeChannels
from sample_runs.parallel.process_groups import Group
from sample_runs.parallel.tp_communications import all_reduce
from sample_runs.parallel.weight_grad_store import WeightGradStore
from tracer.vocab.schedules import Action


@dataclass(frozen=True)
class MicroBatch:
    tokens: torch.Tensor  # (b, s) token ids
    targets: torch.Tensor  # (s, b) next-token ids


class PipelineRunner:
    """Executes F/B/W actions for the chunks of one pipeline rank."""

    def __init__(self, *, chunks: list[GPTChunk], pp: Group, channels: PipeChannels,
                 message_shape: tuple[int, ...], store: Optional[WeightGradStore]):
        self.chunks, self.pp, self.channels, self.store = chunks, pp, channels, store
        self.message_shape = message_shape  # (s[/t], b, h)
        self.num_virtual = pp.size * len(chunks)
        self._saved: dict[tuple[int, int], tuple[Optional[torch.Tensor], torch.Tensor]] = {}

    def run(self, actions: list[Action], batches: list[MicroBatch]) -> list[float]:
        """One iteration; returns the micro-batch losses (on the last stage, else [])."""
        self._batches, self._losses = batches, {}
        for action in actions:
            {"F": self._forward, "B": self._backward, "W": self._weight}[action.kind](action)
        self.channels.wait_sends()
        assert not self._saved and (self.store is None or len(self.store) == 0)
        return [self._losses[i] for i in sorted(self._losses)]

    def _virtual_stage(self, chunk: int) -> int:
        return chunk * self.pp.size + self.pp.rank

    def _tag(self, microbatch: int, receiver: int) -> int:
        return microbatch * self.num_virtual + receiver

    def _forward(self, a: Action) -> None:
        vs, batch = self._virtual_stage(a.chunk), self._batches[a.microbatch]
        last = vs == self.num_virtual - 1
        with tracer.annotate("F", microbatch=a.microbatch, chunk=a.chunk):
            if vs == 0:
                x = batch.tokens
            else:
                x = self.channels.recv(self.message_shape, stage=(vs - 1) % self.pp.size,
                                       tag=self._tag(a.microbatch, vs), grad=False)
                x.requires_grad_()
            out = self.chunks[a.chunk](x, batch.targets if last else None)
            if last:
                self._losses[a.microbatch] = out.item()
                out = out / len(self._batches)  # gradients accumulate over micro-batches
            else:
                self.channels.send(out, stage=(vs + 1) % self.pp.size,
                                   tag=self._tag(a.microbatch, vs + 1), grad=False)
        self._saved[(a.microbatch, a.chunk)] = (x if vs > 0 else None, out)

    def _backward(self, a: Action) -> None:
        vs = self._virtual_stage(a.chunk)
        x, out = self._saved.pop((a.microbatch, a.chunk))
        with tracer.annotate("B", microbatch=a.microbatch, chunk=a.chunk):
            if vs == self.num_virtual - 1:
                out.backward()
            else:
                grad = self.channels.recv(tuple(out.shape), stage=(vs + 1) % self.pp.size,
                                          tag=self._tag(a.microbatch, vs), grad=True)
                torch.autograd.backward(out, grad)
            if x is not None:
                self.channels.send(x.grad, stage=(vs - 1) % self.pp.size,
                                   tag=self._tag(a.microbatch, vs - 1), grad=True)
            if self.store is not None:
                self.store.flush()

    def _weight(self, a: Action) -> None:
        with tracer.annotate("W", microbatch=a.microbatch, chunk=a.chunk):
            self.store.pop()


def all_reduce_tied_embedding_grads(chunks: list[GPTChunk], embedding: Optional[Group]) -> None:
    """Sum the word-embedding gradient of the first stage (lookup) and the last stage (LM
    head) so both copies take the same step: one all-reduce of V/t x h per iteration."""
    if embedding is None:
        return
    for chunk in chunks:
        copy = chunk.tied_embedding_copy()
        if copy is not None:
            all_reduce(copy.grad, embedding)
