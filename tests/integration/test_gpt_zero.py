"""ZeRO stages 1-3 of the reference GPT (--zero) against docs/oracles.md, "Sharded optimizers: ZeRO":
the same losses and step-1 gradients as one process, plain DP's all-reduce replaced bucket by
bucket by a reduce-scatter and an all-gather of a shard (the same traffic), ZeRO-3's gathers
before forward and backward (1.5x the traffic), and what each stage keeps in memory.
Real multi-process gloo runs on CPU."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from support.gpt_helpers import assert_same_numbers, labels, runs_in_background
from sample_runs.model import GPTChunk, GPTConfig
from sample_runs.parallel.data_parallel import partition_buckets
from sample_runs.parallel.process_groups import Group, single_process_groups
from sample_runs.parallel.tensor_parallel import TensorParallel
from sample_runs.parallel.zero_communications import FlatLayout
from sample_runs.train import main

FLOAT = 4
LAYERS = 2

# Three steps (the reduction in step 1, the sharded update and gather in steps 2 and 3) of
# layouts of 4 ranks: (name, ranks, flags), DP halving the micro-batches of the reference.
LAYOUTS = [
    # SP parameters: their TP all-reduce acts on the shards
    ("zero1-tp2-sp-dp2", 4, ["--tp", "2", "--sp", "--pp", "1", "--zero", "1",
                             "--microbatches", "2"]),
    # tied embedding between first and last stage, summed on aligned shards; W passes
    ("zero2-pp2-dp2-zb-h1", 4, ["--tp", "1", "--pp", "2", "--zero", "2", "--schedule", "zb-h1",
                                "--microbatches", "2"]),
    ("zero3-pp2-dp2", 4, ["--tp", "1", "--pp", "2", "--zero", "3", "--microbatches", "2"]),
]
REFERENCES = [("single-m4", 1, ["--tp", "1", "--pp", "1", "--microbatches", "4"]),
              ("single-m2", 1, ["--tp", "1", "--pp", "1", "--microbatches", "2"])]

# One traced iteration each on 2 ranks, one micro-batch per rank (the ZeRO paper's 1.5x counts
# one forward and one backward per iteration); the same buckets for plain DP and ZeRO-1/2.
TRACED = {name: ["--tp", "1", "--pp", "1", "--microbatches", "1", "--bucket-size", "8192",
                 "--layers", str(LAYERS), *flags]
          for name, flags in [("dp", []), ("zero1", ["--zero", "1"]), ("zero2", ["--zero", "2"]),
                              ("zero3", ["--zero", "3"])]}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every run, two launches at a time; values are futures."""
    yield from runs_in_background(
        tmp_path_factory.mktemp("zero"),
        [(name, ranks, [*flags, "--layers", str(LAYERS)])
         for name, ranks, flags in [*REFERENCES, *LAYOUTS]],
        traced={name: (2, flags) for name, flags in TRACED.items()})


def _single_chunk(layers: int) -> GPTChunk:
    cfg = GPTConfig(layers=layers, hidden=32, heads=4, seq_len=16, vocab=256)
    tp = TensorParallel(group=single_process_groups().tp)
    return GPTChunk(cfg, layers=range(layers), first=True, last=True, tp=tp, seed=0)


def model_numel(layers: int = LAYERS) -> int:
    """Parameters of the single-process model (tiny sizes), counted without any ZeRO code."""
    return sum(p.numel() for p in _single_chunk(layers).parameters())


def model_tensors(layers: int = LAYERS) -> int:
    """Parameter tensors of the single-process model: AdamW keeps a step counter for each."""
    return len(list(_single_chunk(layers).parameters()))


@pytest.mark.parametrize("name,ranks,flags", LAYOUTS, ids=[layout[0] for layout in LAYOUTS])
def test_zero_matches_single_process(name, ranks, flags, runs):
    assert_same_numbers(runs[name].result(), runs["single-m4"].result(), steps=3)


@pytest.mark.parametrize("name", list(TRACED))
def test_traced_step_matches_single_process(name, runs):
    assert_same_numbers(runs[name].result()["dump"], runs["single-m2"].result(), steps=1)


def test_memory_each_stage_keeps(runs):
    """Elements held by the reporting rank after step 1's optimizer step (d = 2)."""
    P, tensors = model_numel(), model_tensors()
    single = runs["single-m2"].result()["memory"]
    assert single == {"model_params": P, "model_grads": P, "param_shards": 0, "grad_shards": 0,
                      "optimizer_state": 2 * P, "optimizer_steps": tensors}
    assert runs["dp"].result()["dump"]["memory"] == single
    zero1, zero2, zero3 = (dict(runs[f"zero{i}"].result()["dump"]["memory"]) for i in (1, 2, 3))
    # ZeRO: a step counter per flat shard the optimizer updates (a shard per bucket), fewer
    # than the model's tensors
    assert all(1 <= zero.pop("optimizer_steps") < tensors for zero in (zero1, zero2, zero3))
    # ZeRO-1: optimizer state / d; the full local gradients stay (Megatron's gradient buffer)
    assert zero1 == {"model_params": P, "model_grads": P, "param_shards": P // 2,
                     "grad_shards": P // 2, "optimizer_state": P}
    # ZeRO-2: also gradients / d
    assert zero2 == {**zero1, "model_grads": 0}
    # ZeRO-3: also parameters / d (the full ones are freed outside forward and backward)
    assert zero3 == {**zero2, "model_params": 0}


def _grad_sync(records, kind):
    return [r for r in records if r["kind"] == kind and labels(r)[-1:] == ["grad-sync"]]


def _param_gathers(records, outer):
    return [r for r in records if r["kind"] == "all_gather" and labels(r)[:1] == [outer]
            and labels(r)[-1] == "param-gather"]


def test_zero1_and_2_replace_each_all_reduce_by_reduce_scatter_and_all_gather(runs):
    d, P = 2, model_numel()
    for name in ("zero1", "zero2"):
        for dp, zero in zip(runs["dp"].result()["records"], runs[name].result()["records"]):
            _check_same_traffic_as_dp(dp, zero, d, P)


def _check_same_traffic_as_dp(dp: list[dict], zero: list[dict], d: int, P: int) -> None:
    all_reduces = _grad_sync(dp, "all_reduce")
    buckets = [r["bytes"] for r in all_reduces]
    assert sum(buckets) == P * FLOAT and len(buckets) >= 3
    assert not _grad_sync(dp, "reduce_scatter") and not _param_gathers(dp, "optimizer")
    # per bucket, in the same order: a reduce-scatter of the bucket, launched from the
    # gradient hooks inside the backward pass (the phase the tracer gives DP's buckets there)...
    scatters = _grad_sync(zero, "reduce_scatter")
    assert [r["bytes"] for r in scatters] == buckets
    assert [r["phase"] for r in scatters] == [r["phase"] for r in all_reduces]
    assert all(labels(r) == ["B", "grad-sync"] and r["group"] == (0, 1) for r in scatters)
    # ...and an all-gather of its 1/d shard inside the optimizer step
    gathers = _param_gathers(zero, "optimizer")
    assert [r["bytes"] for r in gathers] == [b // d for b in buckets]
    assert all(r["phase"] == "optimizer" and r["step"] == 0 for r in gathers)
    assert not _grad_sync(zero, "all_reduce")
    # the same traffic as plain DP: ring all-reduce 2(d-1)/d P = reduce-scatter (d-1)/d P
    # + all-gather of (d-1) shards of P/d
    moved_dp = sum(2 * (d - 1) / d * b for b in buckets)
    moved_zero = sum((d - 1) / d * r["bytes"] for r in scatters) + \
        sum((d - 1) * r["bytes"] for r in gathers)
    assert moved_zero == moved_dp


def test_zero_stage_is_in_the_recorded_config(runs):
    for stage in range(4):
        name = f"zero{stage}" if stage else "dp"
        config = runs[name].result()["config"]
        assert (config["zero"], config["dp"], config["cp"]) == (stage, 2, 1)


def test_zero3_gathers_before_forward_and_backward(runs):
    d, P, layers = 2, model_numel(), LAYERS
    dp_sync = _grad_sync(runs["dp"].result()["records"][0], "all_reduce")
    dp_buckets = [r["bytes"] for r in dp_sync]
    for records in runs["zero3"].result()["records"]:
        forward, backward = _param_gathers(records, "F"), _param_gathers(records, "B")
        scatters = _grad_sync(records, "reduce_scatter")
        # one unit per block and the root (embeddings, final LayerNorm, head)
        units = layers + 1
        assert len(forward) == len(backward) == len(scatters) == units
        assert {r["phase"] for r in forward} == {"forward"}
        assert {r["phase"] for r in backward} == {"backward"}
        assert sum(r["bytes"] for r in forward) == sum(r["bytes"] for r in backward) \
            == P * FLOAT // d
        assert sum(r["bytes"] for r in scatters) == P * FLOAT
        assert {r["phase"] for r in scatters} == {r["phase"] for r in dp_sync}
        assert all(labels(r) == ["B", "grad-sync"] for r in scatters)
        # the root is gathered first in forward, then the blocks in order; backward reverses
        assert [r["module"] for r in forward] == ["GPTChunk", "GPTChunk.blocks.0",
                                                  "GPTChunk.blocks.1"]
        assert [r["module"] for r in backward][1:] == ["GPTChunk.blocks.1", "GPTChunk.blocks.0"]
        # each block's gather precedes its first op of the pass
        for gather in forward[1:] + backward[1:]:
            own = [r for r in records if (r["module"] or "").startswith(gather["module"] + ".")
                   and not r["kind"] and labels(r)[:1] == labels(gather)[:1]]
            assert own and gather["t0"] < min(r["t0"] for r in own)
        # nothing else: no all-reduce of gradients, no gather after the optimizer step
        assert not _grad_sync(records, "all_reduce") and not _param_gathers(records, "optimizer")
        # 1.5x plain DP's traffic: 2 gathers + 1 reduce-scatter against 1 all-reduce
        moved = sum((d - 1) * r["bytes"] for r in forward + backward) + \
            sum((d - 1) / d * r["bytes"] for r in scatters)
        assert moved == 1.5 * sum(2 * (d - 1) / d * b for b in dp_buckets)


def test_buckets_and_shards_partition_every_element():
    params = [torch.nn.Parameter(torch.zeros(n)) for n in (5, 7, 3, 9)]
    buckets = partition_buckets(params, bucket_numel=8, alone=[params[1]])
    # reverse order; params[1] (the "tied embedding") in a bucket of its own
    assert [[p.numel() for p in b] for b in buckets] == [[9], [3], [7], [5]]
    layout_params = [params[3], params[2], params[0]]  # 17 elements, padded to 18 for d = 3
    seen = np.zeros(17, dtype=int)
    for rank in range(3):
        layout = FlatLayout(layout_params, Group(handle=None, rank=rank, ranks=(0, 1, 2)))
        assert (layout.padded_numel, layout.shard_numel) == (18, 6)
        for piece in layout.pieces():
            offset = layout.offsets[[id(p) for p in layout_params].index(id(piece.param))]
            assert piece.shard_hi - piece.shard_lo == piece.param_hi - piece.param_lo
            assert layout.lo + piece.shard_lo == offset + piece.param_lo
            seen[offset + piece.param_lo: offset + piece.param_hi] += 1
    assert (seen == 1).all()


@pytest.mark.parametrize("flags,words", [
    (["--tp", "1", "--pp", "2", "--zero", "3", "--schedule", "zb-h1"],
     "--zero 3 with --schedule zb-h1"),
    (["--tp", "1", "--pp", "1", "--zero", "1", "--moe-experts", "4"],
     "--zero 1 with --moe-experts"),
    (["--tp", "1", "--pp", "1", "--zero", "4"], "invalid choice"),
])
def test_impossible_zero_layouts_exit_2_with_one_line(flags, words, monkeypatch, capsys):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(SystemExit) as exit_info:
        main(flags)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1 and words in err, err
