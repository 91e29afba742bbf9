"""Mixture of experts with expert parallelism (--moe-experts, --ep) against docs/oracles.md, "Expert
parallelism": deterministic top-k routing with capacity (GShard's priority, Switch's aux loss),
the same losses and step-1 gradients as the MoE model in one process (tokens dropped alike),
2 all-to-alls forward and 2 backward per MoE layer per micro-batch of E x C x h elements
(about b*s*k*h times the capacity factor), router and dense weights reduced over DP (which
contains the EP group), expert weights only over expert-DP. Real multi-process gloo runs."""
from __future__ import annotations

from collections import Counter

import pytest
import torch

from support.gpt_helpers import assert_same_numbers, labels, runs_in_background
from sample_runs.model import GPTChunk, GPTConfig, moe_mlp
from sample_runs.parallel.expert_parallel import ExpertParallel, expert_capacity, route
from sample_runs.parallel.process_groups import single_process_groups
from sample_runs.parallel.tensor_parallel import TensorParallel
from sample_runs.train import main

S, B, H, E, K, FACTOR = 16, 2, 32, 4, 2, 0.5
FLOAT = 4
L = 2
MOE = ["--layers", str(L), "--moe-experts", str(E), "--topk", str(K),
       "--capacity-factor", str(FACTOR), "--aux-loss-coeff", "0.1"]

LAYOUTS = [  # three steps against the one-process MoE model with the same global batch
    ("ep2-tp2", 4, ["--tp", "2", "--no-sp", "--pp", "1", "--ep", "2", "--microbatches", "2"]),
    ("ep2-pp2-zb-h1", 4, ["--tp", "1", "--pp", "2", "--ep", "2", "--schedule", "zb-h1",
                          "--microbatches", "2"]),
]
REFERENCE = ("single", 1, ["--tp", "1", "--pp", "1", "--microbatches", "4"])
TRACED = {  # one traced step each, also checked against the reference's first step
    "traced-ep2": (2, ["--tp", "1", "--pp", "1", "--ep", "2", "--microbatches", "2"]),
    # dp 4 = expert-DP 2 x EP 2: EP groups [0,1], [2,3]; expert-DP groups [0,2], [1,3]
    "traced-dp4-ep2": (4, ["--tp", "1", "--pp", "1", "--ep", "2", "--microbatches", "1"]),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("moe")
    yield from runs_in_background(
        tmp, [(name, ranks, [*flags, *MOE]) for name, ranks, flags in [REFERENCE, *LAYOUTS]],
        traced={name: (nproc, [*flags, *MOE]) for name, (nproc, flags) in TRACED.items()})


@pytest.mark.parametrize("name,ranks,flags", LAYOUTS, ids=[layout[0] for layout in LAYOUTS])
def test_moe_layouts_match_single_process(name, ranks, flags, runs):
    assert_same_numbers(runs[name].result(), runs["single"].result())


@pytest.mark.parametrize("name", list(TRACED))
def test_traced_moe_step_matches_single_process(name, runs):
    assert_same_numbers(runs[name].result()["dump"], runs["single"].result())


def test_reference_drops_tokens():
    """With these sizes every expert has fewer slots than the assignments it could get, so the
    numerics tests above compare layouts that drop tokens."""
    capacity = expert_capacity(S * B, E, K, FACTOR)
    assert capacity == 8 and E * capacity < S * B * K


def test_route_capacity_and_priority():
    # tokens 0-2 prefer expert 0 then 1; token 3 prefers expert 1 then 0
    logits = torch.tensor([[2.0, 1.0], [2.0, 1.0], [2.0, 1.0], [1.0, 2.0]])
    routing = route(logits, topk=2, capacity=1)
    # one slot each: expert 0 serves token 0's first choice; expert 1 token 3's first choice,
    # ahead of the earlier tokens' second choices (GShard's priority)
    assert routing.token.tolist() == [0, 3] and routing.slot.tolist() == [0, 1]
    probs = torch.softmax(logits, -1)
    torch.testing.assert_close(routing.gate, torch.stack([probs[0, 0], probs[3, 1]]))
    routing = route(logits, topk=2, capacity=3)
    # expert 0: first choices of tokens 0, 1, 2; expert 1 (slots 3..5): token 3, then 0, 1
    assert routing.token.tolist() == [0, 1, 2, 3, 0, 1]
    assert routing.slot.tolist() == [0, 1, 2, 3, 4, 5]
    again = route(logits, topk=2, capacity=3)
    assert torch.equal(again.token, routing.token) and torch.equal(again.slot, routing.slot)


def test_switch_aux_loss():
    uniform = route(torch.zeros(8, 4), topk=1, capacity=8)
    torch.testing.assert_close(uniform.aux_loss, torch.tensor(1.0))  # E * sum f_i / E
    collapsed = route(torch.tensor([[30.0, 0, 0, 0]] * 8), topk=1, capacity=8)
    torch.testing.assert_close(collapsed.aux_loss, torch.tensor(4.0))  # all on one: E


def test_aux_loss_reaches_the_router_only_through_its_gradient():
    cfg = GPTConfig(layers=1, hidden=H, moe_experts=E)
    x = torch.randn(S, B, H, generator=torch.Generator().manual_seed(0))
    grads = []
    for scale in (0.0, 1.0):
        ep = ExpertParallel(group=single_process_groups().ep, topk=K, capacity_factor=FACTOR,
                            aux_loss_scale=scale)
        moe = moe_mlp(cfg, "blocks.0.mlp", ep, seed=3)
        y = moe(x)
        y.sum().backward()
        grads.append((y.detach(), moe.router.grad, moe.fc1_weight.grad))
    (y0, router0, fc0), (y1, router1, fc1) = grads
    assert torch.equal(y0, y1) and torch.equal(fc0, fc1)  # forward and experts unchanged
    assert not torch.allclose(router0, router1)


def _numels():
    """(dense, expert) parameter elements of the one-process MoE model, by name."""
    cfg = GPTConfig(layers=L, hidden=H, heads=4, seq_len=S, vocab=256, moe_experts=E)
    ep = ExpertParallel(group=single_process_groups().ep, topk=K, capacity_factor=FACTOR,
                        aux_loss_scale=0.0)
    chunk = GPTChunk(cfg, layers=range(L), first=True, last=True, seed=0, ep=ep,
                     tp=TensorParallel(group=single_process_groups().tp))
    params = list(chunk.parameters())
    experts = sum(p.numel() for p in params if ".experts." in p.shard_info.name)
    return sum(p.numel() for p in params) - experts, experts


def test_all_to_all_per_layer_and_microbatch(runs):
    m, capacity = 2, expert_capacity(S * B, E, K, FACTOR)
    for records in runs["traced-ep2"].result()["records"]:
        a2a = [r for r in records if r["kind"] == "all_to_all"]
        per_pass = Counter((r["module"], labels(r)[0], r["annotation"][-1]["microbatch"])
                           for r in a2a)
        # dispatch and combine forward, their transposes backward
        assert per_pass == {(f"GPTChunk.blocks.{i}.mlp", label, mb): 2
                            for i in range(L) for label in ("F", "B") for mb in range(m)}
        # E x C x h: b*s*k*h times the capacity factor (exactly here: no rounding)
        assert {r["bytes"] for r in a2a} == {E * capacity * H * FLOAT} \
            == {int(B * S * K * H * FACTOR) * FLOAT}
        assert {r["group"] for r in a2a} == {(0, 1)}
        assert {(labels(r)[0], r["phase"]) for r in a2a} == {("F", "forward"), ("B", "backward")}
        # forward order per layer: dispatch, the experts' batched matmuls, combine
        for i in range(L):
            module = f"GPTChunk.blocks.{i}.mlp"
            fwd = sorted((r for r in records if r["module"] == module and labels(r) == ["F"]
                          and r["annotation"][-1]["microbatch"] == 0), key=lambda r: r["t0"])
            ops = [r["kind"] or r["op"].split(".")[1] for r in fwd
                   if r["kind"] == "all_to_all" or r["op"].startswith("aten.baddbmm")]
            assert ops == ["all_to_all", "baddbmm", "baddbmm", "all_to_all"]


def test_moe_sizes_are_in_the_recorded_config(runs):
    config = runs["traced-dp4-ep2"].result()["config"]
    assert (config["moe_experts"], config["ep"], config["topk"], config["dp"],
            config["capacity_factor"]) == (E, 2, K, 4, FACTOR)


def test_expert_weights_reduced_over_expert_dp_only(runs):
    dense, experts = _numels()
    sync = lambda records: [r for r in records if r["kind"] == "all_reduce"
                            and labels(r)[-1:] == ["grad-sync"]]
    # dp 2 = EP 2: dense weights over DP, expert weights not at all (one rank per expert)
    for records in runs["traced-ep2"].result()["records"]:
        assert {r["group"] for r in sync(records)} == {(0, 1)}
        assert sum(r["bytes"] for r in sync(records)) == dense * FLOAT
    # dp 4 = expert-DP 2 x EP 2
    for rank, records in enumerate(runs["traced-dp4-ep2"].result()["records"]):
        by_group = Counter()
        for r in sync(records):
            by_group[r["group"]] += r["bytes"]
        assert by_group == {(0, 1, 2, 3): dense * FLOAT,
                            (rank % 2, rank % 2 + 2): experts // 2 * FLOAT}
        a2a = {r["group"] for r in records if r["kind"] == "all_to_all"}
        assert a2a == {(0, 1) if rank < 2 else (2, 3)}


@pytest.mark.parametrize("world,flags,words", [
    (2, ["--tp", "1", "--pp", "1", "--ep", "2"], "--ep 2 needs --moe-experts"),
    (2, ["--tp", "1", "--pp", "1", "--moe-experts", "3", "--ep", "2"], "--ep 2 does not divide"),
    (4, ["--tp", "2", "--no-sp", "--pp", "1", "--moe-experts", "4", "--ep", "4"],
     "it must divide dp 2"),
    (1, ["--tp", "1", "--pp", "1", "--moe-experts", "4", "--topk", "5"], "--topk 5"),
    (2, ["--tp", "2", "--sp", "--pp", "1", "--moe-experts", "4"], "needs --no-sp"),
    (1, ["--tp", "1", "--pp", "1", "--moe-experts", "4", "--capacity-factor", "0"],
     "--capacity-factor must be > 0"),
])
def test_impossible_moe_layouts_exit_2_with_one_line(world, flags, words, monkeypatch, capsys):
    if world > 1:
        monkeypatch.setenv("RANK", "0")
        monkeypatch.setenv("WORLD_SIZE", str(world))
    else:
        monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(SystemExit) as exit_info:
        main(flags)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and words in err, err
