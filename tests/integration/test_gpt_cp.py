"""Context parallelism of the reference GPT (--cp) against docs/oracles.md, "Context parallelism":
load-balanced chunks, ring attention whose blocks reproduce causal attention, c-1 K and c-1 V
transfers of (s/c) x b x h per attention layer per micro-batch forward (c-1 for K/V and c-1 for
their gradients backward), each overlapping the attention compute of the block at hand, and
gradients reduced over DP x CP. Real multi-process gloo runs on CPU."""
from __future__ import annotations

from collections import Counter

import pytest
import torch
import torch.nn.functional as F

from support.gpt_helpers import assert_same_numbers, labels, runs_in_background
from sample_runs.model import GPTChunk, GPTConfig
from sample_runs.parallel.context_parallel import (
    attention_block, attention_block_backward, load_balanced_positions, merge_blocks)
from sample_runs.parallel.process_groups import single_process_groups
from sample_runs.parallel.tensor_parallel import TensorParallel
from sample_runs.train import main

S, B, H = 16, 2, 32
FLOAT = 4

L = 2  # layers
# Three steps of (name, ranks, flags) against the reference with the same global batch.
LAYOUTS = [
    ("cp2", 2, ["--tp", "1", "--pp", "1", "--cp", "2", "--microbatches", "4"]),
    ("cp2-tp2-sp", 4, ["--tp", "2", "--sp", "--pp", "1", "--cp", "2", "--microbatches", "4"]),
    ("cp2-pp2", 4, ["--tp", "1", "--pp", "2", "--cp", "2", "--microbatches", "4"]),
]
REFERENCE = ("single", 1, ["--tp", "1", "--pp", "1", "--microbatches", "4"])
# One traced step each, also checked against the reference's first step.
TRACED = {
    "traced-cp4": (4, ["--tp", "1", "--pp", "1", "--cp", "4", "--microbatches", "4"]),
    "traced-cp2-dp2": (4, ["--tp", "1", "--pp", "1", "--cp", "2", "--dp", "2",
                           "--microbatches", "2"]),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    yield from runs_in_background(
        tmp_path_factory.mktemp("cp"),
        [(name, ranks, [*flags, "--layers", str(L)])
         for name, ranks, flags in [REFERENCE, *LAYOUTS]],
        traced={name: (nproc, [*flags, "--layers", str(L)])
                for name, (nproc, flags) in TRACED.items()})


@pytest.mark.parametrize("name,ranks,flags", LAYOUTS, ids=[layout[0] for layout in LAYOUTS])
def test_cp_matches_single_process(name, ranks, flags, runs):
    assert_same_numbers(runs[name].result(), runs["single"].result())


@pytest.mark.parametrize("name", list(TRACED))
def test_traced_cp_step_matches_single_process(name, runs):
    assert_same_numbers(runs[name].result()["dump"], runs["single"].result())


def test_load_balanced_chunks():
    assert load_balanced_positions(16, 2, 0).tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    assert load_balanced_positions(16, 2, 1).tolist() == list(range(4, 12))
    c = 4
    held = torch.cat([load_balanced_positions(S, c, r) for r in range(c)])
    assert sorted(held.tolist()) == list(range(S))
    # the causal work (query-key pairs a rank computes) is the same on every rank
    work = {int((p.unsqueeze(1) >= torch.arange(S)).sum()) for p in
            (load_balanced_positions(S, c, r) for r in range(c))}
    assert len(work) == 1


@pytest.mark.parametrize("c", [2, 4])
def test_ring_blocks_reproduce_causal_attention(c):
    """Each rank's queries against every rank's key block, merged by log-sum-exp, and the
    per-block backward, against full causal attention and autograd."""
    gen = torch.Generator().manual_seed(0)
    q, k, v, grad_out = (torch.randn(2, 3, S, 8, generator=gen) for _ in range(4))
    q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    reference = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    reference.backward(grad_out)
    positions = [load_balanced_positions(S, c, r) for r in range(c)]
    grad_k, grad_v = torch.zeros_like(k), torch.zeros_like(v)
    for me in range(c):
        mine = positions[me]
        qi, gi = q.detach()[:, :, mine], grad_out[:, :, mine]
        out = lse = None
        for step in range(c):  # the ring order: own block first, then rank me-1, me-2, ...
            src = positions[(me - step) % c]
            visible = mine.unsqueeze(1) >= src.unsqueeze(0)
            block = attention_block(qi, k.detach()[:, :, src], v.detach()[:, :, src], visible)
            out, lse = block if out is None else merge_blocks(out, lse, *block)
        torch.testing.assert_close(out, reference.detach()[:, :, mine])
        grad_q = torch.zeros_like(qi)
        for src_rank in range(c):
            src = positions[src_rank]
            visible = mine.unsqueeze(1) >= src.unsqueeze(0)
            dq, dk, dv = attention_block_backward(qi, k.detach()[:, :, src], v.detach()[:, :, src],
                                                  visible, out, lse, gi)
            grad_q += dq
            grad_k[:, :, src] += dk
            grad_v[:, :, src] += dv
        torch.testing.assert_close(grad_q, q.grad[:, :, mine])
    torch.testing.assert_close(grad_k, k.grad)
    torch.testing.assert_close(grad_v, v.grad)


def _ring(records, label):
    return [r for r in records if r["kind"] in ("send", "recv") and labels(r) == [label]]


def _attention_matmuls(records, module, label):
    return [r for r in records if r["op"].startswith("aten.bmm") and r["module"] == module
            and labels(r) == [label]]


def test_ring_transfers_per_layer_and_overlap(runs):
    c, m = 4, 4
    block = S // c * B * H * FLOAT  # one K or V block: (s/c) x b x h
    for rank, records in enumerate(runs["traced-cp4"].result()["records"]):
        for layer in range(L):
            module = f"GPTChunk.blocks.{layer}.attn"
            fwd = [r for r in _ring(records, "F") if r["module"] == module]
            bwd = [r for r in _ring(records, "B") if r["module"] == module]
            kinds = lambda rs: Counter((r["kind"], r["peer"]) for r in rs)
            # forward: c-1 steps, one K and one V block each way; to rank+1, from rank-1
            assert kinds(fwd) == {("send", (rank + 1) % c): 2 * (c - 1) * m,
                                  ("recv", (rank - 1) % c): 2 * (c - 1) * m}
            # backward: c-1 steps of K and V, c-1 of their gradients
            assert kinds(bwd) == {("send", (rank + 1) % c): 4 * (c - 1) * m,
                                  ("recv", (rank - 1) % c): 4 * (c - 1) * m}
            assert {r["bytes"] for r in fwd + bwd} == {block}
            assert {r["group"] for r in fwd + bwd} == {(0, 1, 2, 3)}
            # overlap: every transfer is posted before and completed after attention matmuls
            # (q k^T and p v) of the block at hand
            matmuls = _attention_matmuls(records, module, "F")
            for r in fwd:
                inside = [mm for mm in matmuls if r["t0"] < mm["t0"] and mm["t1"] < r["t1"]]
                assert len(inside) >= 2, (rank, layer, r)
            # backward: the same for K/V and for every gradient hop but the last one, which
            # brings the rank its own block's gradient after the last block's compute
            matmuls = _attention_matmuls(records, module, "B")
            for mb in range(m):
                mine = sorted((r for r in bwd if r["annotation"][-1]["microbatch"] == mb),
                              key=lambda r: r["t0"])
                lonely = [r for r in mine if not [mm for mm in matmuls
                                                  if r["t0"] < mm["t0"] and mm["t1"] < r["t1"]]]
                assert lonely == mine[-4:]


def test_cp_size_is_in_the_recorded_config(runs):
    config = runs["traced-cp2-dp2"].result()["config"]
    assert (config["cp"], config["dp"], config["tp"], config["pp"]) == (2, 2, 1, 1)


def test_gradients_reduced_over_dp_x_cp(runs):
    cfg = GPTConfig(layers=L, hidden=H, heads=4, seq_len=S, vocab=256)
    chunk = GPTChunk(cfg, layers=range(L), first=True, last=True,
                     tp=TensorParallel(group=single_process_groups().tp), seed=0)
    numel = sum(p.numel() for p in chunk.parameters())
    for rank, records in enumerate(runs["traced-cp2-dp2"].result()["records"]):
        sync = [r for r in records if r["kind"] == "all_reduce" and labels(r)[-1:] == ["grad-sync"]]
        # grid view(pp, dp, cp, tp): CP pairs [0,1], [2,3]; DP pairs [0,2], [1,3]; all four
        # reduce gradients together
        assert {r["group"] for r in sync} == {(0, 1, 2, 3)}
        assert sum(r["bytes"] for r in sync) == numel * FLOAT
        ring = _ring(records, "F") + _ring(records, "B")
        assert {r["group"] for r in ring} == {(0, 1) if rank < 2 else (2, 3)}
        # c = 2: one step each way per layer per micro-batch
        assert len(_ring(records, "F")) == 2 * 2 * L * 2  # (K, V) x (send, recv) x L x m


@pytest.mark.parametrize("world,flags,words", [
    (2, ["--tp", "1", "--pp", "1", "--cp", "2", "--seq-len", "18"], "--seq-len 18"),
    (8, ["--tp", "4", "--sp", "--pp", "1", "--cp", "2", "--seq-len", "20"], "--sp with --cp 2"),
    (4, ["--tp", "1", "--pp", "1", "--cp", "3"], "world size 4 is not a multiple of tp 1 x cp 3"),
    (2, ["--tp", "1", "--pp", "1", "--cp", "2", "--moe-experts", "2", "--no-sp"],
     "--moe-experts with --cp > 1"),
])
def test_impossible_cp_layouts_exit_2_with_one_line(world, flags, words, monkeypatch, capsys):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", str(world))
    with pytest.raises(SystemExit) as exit_info:
        main(flags)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and words in err, err
