"""Context parallelism (Megatron-LM CP; ring attention, Liu et al. 2023): the sequence split over
c ranks, keys and values passed around a ring.

Load balance: the sequence is cut into 2c chunks and CP rank i holds chunks i and 2c-1-i, so
that under the causal mask every rank has the same attention work (Megatron's layout). Outside
attention every op is token-wise and stays local; positions, targets and the loss are this
rank's tokens only.

Attention: rank i starts with its own keys/values and, in c-1 steps, receives those of rank
i-1, i-2, ... while it computes with the block at hand (the P2P of step j is posted before the
block's compute and waited after it). Blocks are merged with the log-sum-exp of each query row
(online softmax, as FlashAttention). The causal mask compares global positions, so it is right
for any layout; rows that see no key of a block get zero weight.

Backward (FlashAttention's): with the final output and log-sum-exp saved, each block's
gradients are computed independently. Keys/values travel the ring again (c-1 steps), and the
gradient of each block travels behind it: started by the first rank that is not its owner,
accumulated by every rank it passes, it reaches its owner after c-1 hops.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from sample_runs.parallel.cp_communications import RingExchange
from sample_runs.parallel.process_groups import Group


def load_balanced_positions(seq_len: int, cp_size: int, cp_rank: int) -> torch.Tensor:
    """Global positions held by ``cp_rank``: chunks cp_rank and 2c-1-cp_rank of 2c. (s/c,)"""
    chunk = seq_len // (2 * cp_size)
    first, second = cp_rank, 2 * cp_size - 1 - cp_rank
    return torch.cat([torch.arange(first * chunk, (first + 1) * chunk),
                      torch.arange(second * chunk, (second + 1) * chunk)])


@dataclass(frozen=True)
class ContextParallel:
    """The CP group and the sequence length being split."""

    group: Group
    seq_len: int

    def positions(self, rank: Optional[int] = None) -> torch.Tensor:
        """Global positions of CP rank ``rank`` (default: this rank). (s/c,)"""
        rank = self.group.rank if rank is None else rank
        return load_balanced_positions(self.seq_len, self.group.size, rank)


def attention_block(q, k, v, visible):
    """Softmax attention of q (b, nh, sq, hs) over one block k, v (b, nh, sk, hs); ``visible``
    (sq, sk) bool. Returns out (b, nh, sq, hs) and lse (b, nh, sq), -inf for rows seeing no key
    (whose out is 0)."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (b, nh, sq, sk)
    scores = scores.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # (b, nh, sq)
    probs = torch.exp(scores - lse.nan_to_num(neginf=0.0).unsqueeze(-1))
    return probs @ v, lse


def merge_blocks(out, lse, block_out, block_lse):
    """Online softmax: combine two partial attentions over disjoint key sets."""
    new_lse = torch.logaddexp(lse, block_lse)  # (b, nh, sq); finite after the diagonal block
    return (out * torch.exp(lse - new_lse).unsqueeze(-1)
            + block_out * torch.exp(block_lse - new_lse).unsqueeze(-1)), new_lse


def attention_block_backward(q, k, v, visible, out, lse, grad_out):
    """Gradients of q, k, v through one block, given the final out and lse of the rows."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    scores = (q @ k.transpose(-2, -1) * scale).masked_fill(~visible, float("-inf"))
    probs = torch.exp(scores - lse.unsqueeze(-1))  # (b, nh, sq, sk): this block's share
    grad_v = probs.transpose(-2, -1) @ grad_out  # (b, nh, sk, hs)
    grad_probs = grad_out @ v.transpose(-2, -1)  # (b, nh, sq, sk)
    row_dot = (grad_out * out).sum(-1, keepdim=True)  # (b, nh, sq, 1)
    grad_scores = probs * (grad_probs - row_dot) * scale
    return grad_scores @ k, grad_scores.transpose(-2, -1) @ q, grad_v


def causal_visibility(cp: ContextParallel, source: int, device: torch.device) -> torch.Tensor:
    """(s/c, s/c) bool: may this rank's query attend to the key of CP rank ``source``."""
    return (cp.positions().unsqueeze(1) >= cp.positions(source).unsqueeze(0)).to(device)


class _RingAttention(torch.autograd.Function):
    """Causal attention of this rank's queries over the keys/values of all CP ranks."""

    @staticmethod
    def forward(ctx, q, k, v, cp: ContextParallel):  # (b, nh/t, s/c, hs) each
        ring, c, me = RingExchange(cp.group), cp.group.size, cp.group.rank
        out = lse = None
        kv = (k, v)
        for step in range(c):
            # post the transfer of the next block before computing with this one
            pending = ring.start(kv, tag=2 * step) if step < c - 1 else None
            visible = causal_visibility(cp, (me - step) % c, q.device)
            block_out, block_lse = attention_block(q, *kv, visible)
            out, lse = (block_out, block_lse) if out is None else \
                merge_blocks(out, lse, block_out, block_lse)
            if pending is not None:
                kv = tuple(ring.wait(pending))
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.cp = cp
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        cp = ctx.cp
        ring, c, me = RingExchange(cp.group), cp.group.size, cp.group.rank
        grad_q = torch.zeros_like(q)
        kv, own, travelling = (k, v), None, None
        tags = 2 * c  # after the forward's
        for step in range(c):
            pending = ring.start(kv, tag=tags + 4 * step) if step < c - 1 else None
            visible = causal_visibility(cp, (me - step) % c, q.device)
            dq, dk, dv = attention_block_backward(q, *kv, visible, out, lse, grad_out)
            grad_q += dq
            if step == 0:
                own = (dk, dv)
            else:
                # the gradient of this block, from the ranks that held it before: add ours and
                # pass it on to the next rank, which holds the block next (or owns it)
                if travelling is not None:
                    dk_before, dv_before = ring.wait(travelling)
                    dk, dv = dk + dk_before, dv + dv_before
                travelling = ring.start((dk, dv), tag=tags + 4 * step + 2)
            if pending is not None:
                kv = tuple(ring.wait(pending))
        grad_k, grad_v = own
        if travelling is not None:  # our own block's gradient, back from the other c-1 ranks
            dk_others, dv_others = ring.wait(travelling)
            grad_k, grad_v = grad_k + dk_others, grad_v + dv_others
        return grad_q, grad_k, grad_v, None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   cp: ContextParallel) -> torch.Tensor:
    """(b, nh/t, s/c, hs) queries, keys, values of this CP rank -> attention output, same shape."""
    return _RingAttention.apply(q, k, v, cp)
