"""Mixture-of-experts MLP with expert parallelism (GShard, Lepikhin et al. 2020; Switch
Transformer, Fedus et al. 2021).

Router: logits = x W_r^T, softmax over the E experts, the top-k experts of each token; a token's
output is the sum over its chosen experts of probability x expert(x) (not renormalised, as in
Switch). Capacity: each expert takes at most C = ceil(capacity_factor * T * k / E) of the T
tokens of a micro-batch on this rank. Assignments are served in priority order, every token's
first choice before any second choice (GShard), tokens in order within a choice; the rest are
dropped (their share of the output is zero; the residual connection carries the token). The
order depends on the router's output only, so dropping is deterministic and the same in any
layout that gives a rank the same micro-batch.

Expert parallelism: the E experts are sharded over the e ranks of the EP group, E/e each. The
tokens are laid out in an (E, C, h) buffer of slots, so that one all-to-all gives rank j the
slots of its experts from every rank; it runs them as one batched matmul per weight over its
(E/e, e*C) slots, and a second all-to-all returns the outputs (ep_communications). The router
and everything outside the experts is replicated over the EP group; expert weights are not.

Load-balancing loss (Switch): aux = E * sum_i f_i P_i, f_i the share of the T*k assignments
routed to expert i (before dropping), P_i the mean router probability of expert i. It joins the
training loss with weight ``coeff`` through its gradient only, as Megatron's
MoEAuxLossAutoScaler does, so no scalar has to travel down the pipeline; the reported loss is the
language-model loss.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from sample_runs.parallel.ep_communications import all_to_all
from sample_runs.parallel.process_groups import Group
from sample_runs.parallel.tensor_parallel import ShardInfo, sharded_parameter


@dataclass(frozen=True)
class ExpertParallel:
    """The EP group and the routing settings shared by every MoE layer of a rank.
    ``aux_loss_scale`` is the gradient the aux loss receives: coeff / micro-batches, since the
    training loss of an iteration is the mean over micro-batches."""

    group: Group
    topk: int
    capacity_factor: float
    aux_loss_scale: float


@dataclass(frozen=True)
class Routing:
    """The kept (token, expert) assignments of one micro-batch."""

    token: torch.Tensor  # (n,) token index of each kept assignment
    slot: torch.Tensor  # (n,) expert * capacity + its place in the expert's queue
    gate: torch.Tensor  # (n,) router probability weighting the expert's output
    aux_loss: torch.Tensor  # () Switch load-balancing loss


def expert_capacity(tokens: int, experts: int, topk: int, factor: float) -> int:
    """Slots per expert: ceil(factor * tokens * topk / experts)."""
    return math.ceil(factor * tokens * topk / experts)


def route(logits: torch.Tensor, *, topk: int, capacity: int) -> Routing:
    """Top-k routing with capacity and the Switch aux loss; logits (T, E)."""
    num_tokens, num_experts = logits.shape
    probs = torch.softmax(logits, dim=-1)  # (T, E)
    gates, experts = probs.topk(topk, dim=-1)  # (T, k)
    choices = experts.t().reshape(-1)  # (k*T,): all first choices, then all second choices...
    one_hot = F.one_hot(choices, num_experts)  # (k*T, E)
    place = (one_hot.cumsum(0) * one_hot).sum(-1) - 1  # (k*T,) place in its expert's queue
    kept = place < capacity
    token = torch.arange(num_tokens, device=logits.device).repeat(topk)
    fraction = one_hot.float().mean(0)  # f_i, (E,)
    aux_loss = num_experts * (fraction * probs.mean(0)).sum()
    return Routing(token=token[kept], slot=(choices * capacity + place)[kept],
                   gate=gates.t().reshape(-1)[kept], aux_loss=aux_loss)


class _AuxLossGradient(torch.autograd.Function):
    """Identity on the layer output; backward gives the aux loss the gradient ``scale``
    (Megatron's MoEAuxLossAutoScaler)."""

    @staticmethod
    def forward(ctx, output, aux_loss, scale):
        ctx.save_for_backward(aux_loss)
        ctx.scale = scale
        return output

    @staticmethod
    def backward(ctx, grad):
        (aux_loss,) = ctx.saved_tensors
        return grad, torch.full_like(aux_loss, ctx.scale), None


class MixtureOfExperts(nn.Module):
    """E experts of the MLP's shape (h -> 4h -> GELU -> h), E/e on this rank, and a router.

    Built from the full single-process tensors: router (E, h), fc1 (E, 4h, h) and (E, 4h),
    fc2 (E, h, 4h) and (E, h); expert tensors are split over the EP group along E."""

    def __init__(self, *, name: str, router: torch.Tensor, fc1: tuple[torch.Tensor, torch.Tensor],
                 fc2: tuple[torch.Tensor, torch.Tensor], ep: ExpertParallel):
        super().__init__()
        self.ep, self.num_experts = ep, router.shape[0]
        group = ep.group
        self.router = sharded_parameter(router, ShardInfo(f"{name}.router.weight",
                                                          tuple(router.shape)), group)

        def expert_param(full: torch.Tensor, suffix: str) -> nn.Parameter:
            info = ShardInfo(f"{name}.experts.{suffix}", tuple(full.shape), 0,
                             expert_parallel=True)
            return sharded_parameter(full, info, group)

        self.fc1_weight, self.fc1_bias = expert_param(fc1[0], "fc1.weight"), \
            expert_param(fc1[1], "fc1.bias")  # (E/e, 4h, h), (E/e, 4h)
        self.fc2_weight, self.fc2_bias = expert_param(fc2[0], "fc2.weight"), \
            expert_param(fc2[1], "fc2.bias")  # (E/e, h, 4h), (E/e, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (s, b, h)
        s, b, h = x.shape
        e, experts = self.ep.group.size, self.num_experts
        local = experts // e
        tokens = x.reshape(s * b, h)  # (T, h)
        capacity = expert_capacity(s * b, experts, self.ep.topk, self.ep.capacity_factor)
        routing = route(tokens @ self.router.t(), topk=self.ep.topk, capacity=capacity)
        slots = tokens.new_zeros(experts * capacity, h).index_copy(
            0, routing.slot, tokens[routing.token])  # (E*C, h), empty slots zero
        # dispatch: rank j receives, from every rank, the slots of experts j*E/e .. (j+1)*E/e-1
        received = all_to_all(slots.view(e, local * capacity, h), self.ep.group)  # (e, E/e*C, h)
        expert_in = received.view(e, local, capacity, h).transpose(0, 1) \
            .reshape(local, e * capacity, h)  # (E/e, e*C, h)
        hidden = F.gelu(torch.baddbmm(self.fc1_bias.unsqueeze(1), expert_in,
                                      self.fc1_weight.transpose(1, 2)))  # (E/e, e*C, 4h)
        expert_out = torch.baddbmm(self.fc2_bias.unsqueeze(1), hidden,
                                   self.fc2_weight.transpose(1, 2))  # (E/e, e*C, h)
        # combine: every slot goes back to the rank its token came from
        returned = all_to_all(expert_out.view(local, e, capacity, h).transpose(0, 1).contiguous(),
                              self.ep.group)  # (e, E/e, C, h) = (E, C, h)
        weighted = returned.reshape(experts * capacity, h)[routing.slot] \
            * routing.gate.unsqueeze(-1)  # (n, h)
        y = tokens.new_zeros(s * b, h).index_add(0, routing.token, weighted)  # (T, h)
        y = _AuxLossGradient.apply(y, routing.aux_loss, self.ep.aux_loss_scale)
        return y.view(s, b, h)
