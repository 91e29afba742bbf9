"""Small pure pieces of the reference GPT: sharding, the rank grid, the data split."""
from __future__ import annotations

import torch

from sample_runs.data import load_corpus, microbatches
from sample_runs.parallel.process_groups import rank_grid
from sample_runs.parallel.tensor_parallel import ShardInfo


def test_fused_qkv_shards_hold_whole_heads_of_q_k_and_v():
    h, t = 8, 2
    full = torch.arange(3 * h * h, dtype=torch.float32).view(3 * h, h)  # rows [q; k; v]
    info = ShardInfo("qkv.weight", (3 * h, h), dim=0, groups=3)
    shards = [info.shard(full, rank, t) for rank in range(t)]
    assert shards[1].shape == (3 * h // t, h)
    q, k, v = full.view(3, h, h)
    assert torch.equal(shards[1], torch.cat([q[4:], k[4:], v[4:]]))
    assert torch.equal(info.unshard(shards), full)


def test_row_parallel_shards_split_input_features():
    full = torch.randn(6, 8)
    info = ShardInfo("proj.weight", (6, 8), dim=1)
    shards = [info.shard(full, r, 4) for r in range(4)]
    assert shards[3].shape == (6, 2) and torch.equal(info.unshard(shards), full)


def test_rank_grid_is_megatron_order():
    grid = rank_grid(tp=2, dp=2, pp=4)  # docs/oracles.md: 16 ranks, t=2, d=2, p=4
    assert grid[0, 0, :].tolist() == [0, 1] and grid[0, 1, :].tolist() == [2, 3]
    assert grid[0, :, 0].tolist() == [0, 2] and grid[1, :, 0].tolist() == [4, 6]
    assert grid[:, 0, 0].tolist() == [0, 4, 8, 12]


def test_dp_ranks_split_the_single_process_batch():
    corpus = load_corpus()
    common = dict(step=3, seed=5, seq_len=8, micro_batch_size=2, device=torch.device("cpu"))
    single = microbatches(corpus, num_microbatches=4, dp_rank=0, dp_size=1, **common)
    split = [mb for r in range(2)
             for mb in microbatches(corpus, num_microbatches=2, dp_rank=r, dp_size=2, **common)]
    for a, b in zip(single, split, strict=True):
        assert torch.equal(a.tokens, b.tokens) and torch.equal(a.targets, b.targets)
    assert single[0].tokens.shape == (2, 8) and single[0].targets.shape == (8, 2)
    assert torch.equal(single[0].targets[:-1], single[0].tokens[:, 1:].t())


def test_corpus_is_plain_text_of_30_to_100_kb():
    corpus = load_corpus()
    assert 30_000 <= len(corpus) <= 100_000 and int(corpus.max()) < 128
