"""Train the reference GPT with Megatron-style TP, SP, PP and DP; prints `step <i> loss <x>`.

    torchrun --nproc-per-node 4 -m sample_runs.train                      # tp2+sp x pp2, 1f1b
    torchrun --nproc-per-node 4 -m sample_runs.train --tp 2 --no-sp --dp 2 --pp 1
    torchrun --nproc-per-node 2 -m sample_runs.train --tp 1 --pp 2 --schedule interleaved \
        --virtual-stages 2
    python -m sample_runs.train --tp 1 --pp 1 --steps 100                # one process

Under trace-run every rank's aten ops and collectives are recorded; passes are annotated F, B,
W, grad-sync and optimizer. See docs/reference-gpt.md.
"""
from __future__ import annotations

import json
import os
import sys
from collections import defaultdict
from pathlib import Path
from typing import Optional

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

import tracer
from sample_runs.config import ConfigError, RunConfig, parse_config
from sample_runs.data import load_corpus, microbatches
from sample_runs.model import GPTChunk
from sample_runs.parallel.data_parallel import BucketedGradReducer
from sample_runs.parallel.pipeline_parallel import PipelineRunner, all_reduce_tied_embedding_grads
from sample_runs.parallel.pp_communications import PipeChannels
from sample_runs.parallel.pp_schedules import schedule_actions
from sample_runs.parallel.process_groups import ParallelGroups, build_groups, single_process_groups
from sample_runs.parallel.tensor_parallel import TensorParallel, all_reduce_sequence_parallel_grads
from sample_runs.parallel.tp_communications import all_reduce
from sample_runs.parallel.weight_grad_store import WeightGradStore

DEFAULT_WORLD_SIZE = 4  # the default flags describe tp 2 (+sp) x pp 2 on 4 ranks


def init_distributed(cfg: RunConfig) -> tuple[ParallelGroups, torch.device]:
    """One code path for CUDA + NCCL (one GPU per rank) and CPU + gloo; no RANK: one process."""
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if "RANK" not in os.environ:
        return single_process_groups(), device
    dist.init_process_group("nccl" if cuda else "gloo")
    return build_groups(tp=cfg.tp, dp=cfg.dp, pp=cfg.pp), device


def build_chunks(*, cfg: RunConfig, groups: ParallelGroups, store: Optional[WeightGradStore],
                 device: torch.device) -> list[GPTChunk]:
    """The model chunks of this rank: chunk c is virtual stage c*p + r."""
    tp = TensorParallel(group=groups.tp, sequence_parallel=cfg.sp, weight_grad_store=store)
    stages = cfg.pp * cfg.virtual_stages
    per_stage = cfg.model.layers // stages
    chunks = []
    for chunk in range(cfg.virtual_stages):
        vs = chunk * cfg.pp + groups.pp.rank
        chunks.append(GPTChunk(cfg.model, layers=range(vs * per_stage, (vs + 1) * per_stage),
                               first=vs == 0, last=vs == stages - 1, tp=tp, seed=cfg.seed))
    return [c.to(device).train() for c in chunks]


def rank_parameters(chunks: list[GPTChunk]) -> list[nn.Parameter]:
    return [p for chunk in chunks for p in chunk.parameters()]


def finalize_grads(*, chunks: list[GPTChunk], groups: ParallelGroups,
                   reducer: Optional[BucketedGradReducer]) -> None:
    """Megatron's finalize_model_grads: DP buckets, then SP params over TP, then the tied
    embedding between first and last stage."""
    with tracer.annotate("grad-sync"):
        if reducer is not None:
            reducer.finish()
        all_reduce_sequence_parallel_grads(rank_parameters(chunks), groups.tp)
        all_reduce_tied_embedding_grads(chunks, groups.embedding)


def reporting_rank(groups: ParallelGroups) -> bool:
    """The last pipeline stage, TP rank 0, DP rank 0 prints and dumps."""
    return groups.pp.rank == groups.pp.size - 1 and groups.tp.rank == 0 and groups.dp.rank == 0


def iteration_loss(losses: list[float], groups: ParallelGroups,
                   device: torch.device) -> Optional[float]:
    """Mean over micro-batches and DP ranks, on last-stage ranks (None elsewhere)."""
    if groups.pp.rank != groups.pp.size - 1:
        return None
    loss = torch.tensor(sum(losses) / len(losses), dtype=torch.float64, device=device)
    return all_reduce(loss, groups.dp).item() / groups.dp.size


def gather_full_grads(chunks: list[GPTChunk], groups: ParallelGroups) -> Optional[dict]:
    """Every parameter's gradient as the full single-process tensor, on the reporting rank."""
    local = {}
    if groups.dp.rank == 0:
        for param in rank_parameters(chunks):
            local.setdefault(param.shard_info.name, (param.shard_info, param.grad.detach().cpu()))
    if groups.world_size == 1:
        gathered = [(0, local)]
    else:
        dst = _reporting_global_rank(groups)
        gathered = [None] * groups.world_size if groups.world_rank == dst else None
        dist.gather_object((groups.tp.rank, local), gathered, dst=dst)
        if gathered is None:
            return None
    shards, infos = defaultdict(dict), {}
    for tp_rank, params in gathered:
        for name, (info, grad) in params.items():
            shards[name][tp_rank], infos[name] = grad, info
    return {name: infos[name].unshard([s[r] for r in sorted(s)]).numpy()
            for name, s in sorted(shards.items())}


def _reporting_global_rank(groups: ParallelGroups) -> int:
    """Global rank of (pp = p-1, dp = 0, tp = 0): global = tp + t*(dp + d*pp)."""
    return groups.tp.size * groups.dp.size * (groups.pp.size - 1)


def train(*, cfg: RunConfig, groups: ParallelGroups, device: torch.device) -> list[float]:
    """Run ``cfg.steps`` iterations; returns the reported losses (on the reporting rank)."""
    corpus = load_corpus()
    store = WeightGradStore() if cfg.schedule == "zb-h1" else None
    chunks = build_chunks(cfg=cfg, groups=groups, store=store, device=device)
    params = rank_parameters(chunks)
    reducer = None
    if groups.dp.size > 1:
        reducer = BucketedGradReducer(params, groups.dp, bucket_numel=cfg.bucket_size,
                                      accumulations=cfg.microbatches)
        if store is not None:
            store.on_grad_ready = reducer.grad_ready
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    m = cfg.model
    message_shape = (m.seq_len // cfg.tp if cfg.sp else m.seq_len, cfg.micro_batch_size, m.hidden)
    channels = PipeChannels(groups.pp, groups.pp_grad, device)
    runner = PipelineRunner(chunks=chunks, pp=groups.pp, channels=channels,
                            message_shape=message_shape, store=store)
    actions = schedule_actions(cfg.schedule, stages=cfg.pp, rank=groups.pp.rank,
                               microbatches=cfg.microbatches, chunks=cfg.virtual_stages)
    reported, grads = [], None
    for step in range(1, cfg.steps + 1):
        optimizer.zero_grad(set_to_none=True)
        batches = microbatches(corpus, step=step, seed=cfg.seed, seq_len=m.seq_len,
                               micro_batch_size=cfg.micro_batch_size,
                               num_microbatches=cfg.microbatches, dp_rank=groups.dp.rank,
                               dp_size=groups.dp.size, device=device)
        losses = runner.run(actions, batches)
        finalize_grads(chunks=chunks, groups=groups, reducer=reducer)
        if step == 1 and cfg.dump_grads:
            grads = gather_full_grads(chunks, groups)
        with tracer.annotate("optimizer"):
            optimizer.step()
        loss = iteration_loss(losses, groups, device)
        if reporting_rank(groups):
            print(f"step {step} loss {loss:.6f}", flush=True)
            reported.append(loss)
    if cfg.dump and reporting_rank(groups):
        write_dump(cfg, reported, grads)
    return reported


def write_dump(cfg: RunConfig, losses: list[float], grads: Optional[dict]) -> None:
    """FILE: JSON {"config", "losses", "grads"}; grads (if any) in FILE.grads.npz, keyed by
    the full parameter names of the single-process model."""
    out = {"config": cfg.as_dict(), "losses": losses, "grads": None}
    if grads is not None:
        out["grads"] = str(Path(cfg.dump).with_suffix(".grads.npz"))
        np.savez(out["grads"], **grads)
    Path(cfg.dump).write_text(json.dumps(out, indent=1))


def main(argv: Optional[list[str]] = None) -> None:
    try:
        world_size = int(os.environ.get("WORLD_SIZE", "1")) if "RANK" in os.environ else 1
        cfg = parse_config(argv, world_size=world_size)
        if cfg.model.seq_len + 1 >= len(load_corpus()):
            raise ConfigError(f"--seq-len {cfg.model.seq_len} is longer than the corpus")
    except ConfigError as err:
        print(f"python -m sample_runs.train: error: {err}", file=sys.stderr)
        sys.exit(2)
    torch.manual_seed(cfg.seed)
    groups, device = init_distributed(cfg)
    tracer.record_config(**cfg.tracer_config())
    try:
        train(cfg=cfg, groups=groups, device=device)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
