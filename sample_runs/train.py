"""Train the reference GPT with Megatron-style TP, SP, CP, PP, DP, ZeRO and EP; prints
`step <i> loss <x>`.

    torchrun --nproc-per-node 4 -m sample_runs.train                      # tp2+sp x pp2, 1f1b
    torchrun --nproc-per-node 4 -m sample_runs.train --tp 2 --no-sp --dp 2 --pp 1
    torchrun --nproc-per-node 2 -m sample_runs.train --tp 1 --pp 2 --schedule interleaved \
        --virtual-stages 2
    torchrun --nproc-per-node 2 -m sample_runs.train --tp 1 --pp 1 --zero 1     # ZeRO-1 over dp 2
    torchrun --nproc-per-node 2 -m sample_runs.train --tp 1 --pp 1 --cp 2       # ring attention
    torchrun --nproc-per-node 2 -m sample_runs.train --tp 1 --pp 1 --moe-experts 4 --ep 2
    python -m sample_runs.train --tp 1 --pp 1 --steps 100                # one process

Under trace-run every rank's aten ops and collectives are recorded; passes are annotated F, B,
W, grad-sync, optimizer and param-gather. See docs/reference-gpt.md.
"""
from __future__ import annotations

import os
import sys
from typing import Optional, Union

import torch
import torch.distributed as dist
from torch import nn

import tracer
from sample_runs.config import ConfigError, RunConfig, parse_config
from sample_runs.data import context_parallel_split, load_corpus, microbatches
from sample_runs.device import Placement, choose_placement
from sample_runs.dump import gather_full_grads, held_elements, write_dump
from sample_runs.model import GPTChunk
from sample_runs.parallel.context_parallel import ContextParallel
from sample_runs.parallel.data_parallel import BucketedGradReducer
from sample_runs.parallel.expert_parallel import ExpertParallel
from sample_runs.parallel.pipeline_parallel import PipelineRunner, all_reduce_tied_embedding_grads
from sample_runs.parallel.pp_communications import PipeChannels
from sample_runs.parallel.process_groups import ParallelGroups, build_groups, single_process_groups
from sample_runs.parallel.tensor_parallel import TensorParallel, all_reduce_sequence_parallel_grads
from sample_runs.parallel.tp_communications import all_reduce
from sample_runs.parallel.weight_grad_store import WeightGradStore
from sample_runs.parallel.zero import ShardedAdamW, ShardedGradReducer
from sample_runs.parallel.zero3 import ShardedParameters
from sample_runs.parallel.zero_communications import all_reduce_shard_pieces, \
    gather_full_grads as gather_sharded_grads
from tracer.vocab.schedules import schedule_actions

DEFAULT_WORLD_SIZE = 4  # the default flags describe tp 2 (+sp) x pp 2 on 4 ranks
Sharding = Union[ShardedGradReducer, ShardedParameters]


def init_distributed(cfg: RunConfig, placement: Placement) -> tuple[ParallelGroups, torch.device]:
    """One code path for CUDA + NCCL (one GPU per rank) and CPU + gloo; no RANK: one process."""
    cuda = placement.device_type == "cuda"
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if "RANK" not in os.environ:
        return single_process_groups(), device
    dist.init_process_group(placement.backend)
    return build_groups(tp=cfg.tp, dp=cfg.dp, pp=cfg.pp, cp=cfg.cp, ep=cfg.ep), device


def build_chunks(*, cfg: RunConfig, groups: ParallelGroups, store: Optional[WeightGradStore],
                 device: torch.device) -> list[GPTChunk]:
    """The model chunks of this rank: chunk c is virtual stage c*p + r."""
    tp = TensorParallel(group=groups.tp, sequence_parallel=cfg.sp, weight_grad_store=store)
    cp = ContextParallel(groups.cp, cfg.model.seq_len) if cfg.cp > 1 else None
    ep = None
    if cfg.model.moe_experts:
        ep = ExpertParallel(group=groups.ep, topk=cfg.model.moe_topk,
                            capacity_factor=cfg.model.capacity_factor,
                            aux_loss_scale=cfg.model.aux_loss_coeff / cfg.microbatches)
    stages = cfg.pp * cfg.virtual_stages
    per_stage = cfg.model.layers // stages
    chunks = []
    for chunk in range(cfg.virtual_stages):
        vs = chunk * cfg.pp + groups.pp.rank
        chunks.append(GPTChunk(cfg.model, layers=range(vs * per_stage, (vs + 1) * per_stage),
                               first=vs == 0, last=vs == stages - 1, tp=tp, seed=cfg.seed,
                               cp=cp, ep=ep))
    return [c.to(device).train() for c in chunks]


def rank_parameters(chunks: list[GPTChunk]) -> list[nn.Parameter]:
    return [p for chunk in chunks for p in chunk.parameters()]


def _tied_copies(chunks: list[GPTChunk]) -> list[nn.Parameter]:
    return [p for p in (c.tied_embedding_copy() for c in chunks) if p is not None]


def build_optimizer(*, cfg: RunConfig, groups: ParallelGroups, chunks: list[GPTChunk],
                    store: Optional[WeightGradStore]
                    ) -> tuple[list[BucketedGradReducer], Optional[Sharding],
                               torch.optim.Optimizer]:
    """Gradient reduction and optimizer: plain DP buckets (dense weights over DP x CP, expert
    weights over expert-DP) and AdamW, or ZeRO-1/2/3 sharding over DP x CP and AdamW on the
    shards."""
    params, group, m = rank_parameters(chunks), groups.dp_cp, cfg.microbatches
    adamw = dict(lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    if cfg.zero == 3:
        sharding = ShardedParameters(chunks, group, accumulations=m, alone=_tied_copies(chunks))
        return [], sharding, ShardedAdamW(sharding, **adamw)
    if cfg.zero in (1, 2):
        sharding = ShardedGradReducer(params, group, bucket_numel=cfg.bucket_size,
                                      accumulations=m, keep_full_grads=cfg.zero == 1,
                                      alone=_tied_copies(chunks))
        if store is not None:
            store.on_grad_ready = sharding.grad_ready
        return [], sharding, ShardedAdamW(sharding, **adamw)
    reducers = []
    if group.size > 1:
        experts = [p for p in params if p.shard_info.expert_parallel]
        dense = [p for p in params if not p.shard_info.expert_parallel]
        reducers.append(BucketedGradReducer(dense, group, bucket_numel=cfg.bucket_size,
                                            accumulations=m))
        if experts:  # their gradients already sum the EP group's tokens
            reducers.append(BucketedGradReducer(experts, groups.expert_dp, scale=1 / group.size,
                                                bucket_numel=cfg.bucket_size, accumulations=m))
        if store is not None:  # W passes accumulate attention weights only, never experts
            store.on_grad_ready = reducers[0].grad_ready
    return reducers, None, torch.optim.AdamW(params, **adamw)


def finalize_grads(*, chunks: list[GPTChunk], groups: ParallelGroups,
                   reducers: list[BucketedGradReducer], sharding: Optional[Sharding]) -> None:
    """Megatron's finalize_model_grads: DP buckets, then SP params over TP, then the tied
    embedding between first and last stage."""
    with tracer.annotate("grad-sync"):
        for reducer in reducers:
            reducer.finish()
        if sharding is None:
            all_reduce_sequence_parallel_grads(rank_parameters(chunks), groups.tp)
            all_reduce_tied_embedding_grads(chunks, groups.embedding)
            return
        # NOTE: ZeRO keeps only this rank's shard of the reduced gradients; the sums over TP
        # and over the embedding group commute with the DP reduction, so they act on the shard
        sharding.finish()
        all_reduce_shard_pieces(sharding.shard_grads(),
                                lambda p: p.shard_info.sequence_parallel, groups.tp)
        if groups.embedding is not None:
            tied = {id(p) for p in _tied_copies(chunks)}
            all_reduce_shard_pieces(sharding.shard_grads(), lambda p: id(p) in tied,
                                    groups.embedding)


def reporting_rank(groups: ParallelGroups) -> bool:
    """The last pipeline stage, TP rank 0, DP (x CP) rank 0 prints and dumps."""
    return groups.pp.rank == groups.pp.size - 1 and groups.tp.rank == 0 and groups.dp_cp.rank == 0


def iteration_loss(losses: list[float], groups: ParallelGroups,
                   device: torch.device) -> Optional[float]:
    """Mean over micro-batches and DP (x CP) ranks, on last-stage ranks (None elsewhere)."""
    if groups.pp.rank != groups.pp.size - 1:
        return None
    loss = torch.tensor(sum(losses) / len(losses), dtype=torch.float64, device=device)
    return all_reduce(loss, groups.dp_cp).item() / groups.dp_cp.size


def step_one_grads(chunks: list[GPTChunk], groups: ParallelGroups,
                   sharding: Optional[Sharding]) -> Optional[dict]:
    """Full step-1 gradients for --dump-grads (ZeRO: all-gathered from the shards)."""
    if sharding is None:
        return gather_full_grads(rank_parameters(chunks), groups, lambda p: p.grad)
    full = gather_sharded_grads(sharding.shard_grads())
    return gather_full_grads(rank_parameters(chunks), groups, lambda p: full[id(p)])


def train(*, cfg: RunConfig, groups: ParallelGroups, device: torch.device) -> list[float]:
    """Run ``cfg.steps`` iterations; returns the reported losses (on the reporting rank)."""
    corpus = load_corpus()
    store = WeightGradStore() if cfg.schedule == "zb-h1" else None
    chunks = build_chunks(cfg=cfg, groups=groups, store=store, device=device)
    reducers, sharding, optimizer = build_optimizer(cfg=cfg, groups=groups, chunks=chunks,
                                                    store=store)
    m = cfg.model
    seq = m.seq_len // cfg.cp
    message_shape = (seq // cfg.tp if cfg.sp else seq, cfg.micro_batch_size, m.hidden)
    channels = PipeChannels(groups.pp, groups.pp_grad, device)
    runner = PipelineRunner(chunks=chunks, pp=groups.pp, channels=channels,
                            message_shape=message_shape, store=store)
    actions = schedule_actions(cfg.schedule, stages=cfg.pp, rank=groups.pp.rank,
                               microbatches=cfg.microbatches, chunks=cfg.virtual_stages)
    positions = ContextParallel(groups.cp, m.seq_len).positions() if cfg.cp > 1 else None
    reported, grads, memory = [], None, None
    for step in range(1, cfg.steps + 1):
        optimizer.zero_grad(set_to_none=True)
        batches = microbatches(corpus, step=step, seed=cfg.seed, seq_len=m.seq_len,
                               micro_batch_size=cfg.micro_batch_size,
                               num_microbatches=cfg.microbatches, dp_rank=groups.dp.rank,
                               dp_size=groups.dp.size, device=device)
        if positions is not None:
            batches = context_parallel_split(batches, positions)
        losses = runner.run(actions, batches)
        finalize_grads(chunks=chunks, groups=groups, reducers=reducers, sharding=sharding)
        if step == 1 and cfg.dump_grads:
            grads = step_one_grads(chunks, groups, sharding)
        with tracer.annotate("optimizer"):
            optimizer.step()
        if step == 1 and cfg.dump:
            memory = held_elements(rank_parameters(chunks), optimizer)
        loss = iteration_loss(losses, groups, device)
        if reporting_rank(groups):
            print(f"step {step} loss {loss:.6f}", flush=True)
            reported.append(loss)
    if cfg.dump and reporting_rank(groups):
        write_dump(cfg.dump, cfg.as_dict(), reported, grads, memory)
    return reported


def main(argv: Optional[list[str]] = None) -> None:
    distributed = "RANK" in os.environ
    try:
        world_size = int(os.environ.get("WORLD_SIZE", "1")) if distributed else 1
        cfg = parse_config(argv, world_size=world_size)
        if cfg.model.seq_len + 1 >= len(load_corpus()):
            raise ConfigError(f"--seq-len {cfg.model.seq_len} is longer than the corpus")
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1")) if distributed else 1
        placement = choose_placement(cfg.device, gpus=torch.cuda.device_count(),
                                     local_world_size=local_world)
    except ConfigError as err:
        print(f"python -m sample_runs.train: error: {err}", file=sys.stderr)
        sys.exit(2)
    if placement.note and int(os.environ.get("LOCAL_RANK", "0")) == 0:
        print(f"python -m sample_runs.train: {placement.note}", file=sys.stderr, flush=True)
    torch.manual_seed(cfg.seed)
    groups, device = init_distributed(cfg, placement)
    tracer.record_config(**cfg.tracer_config())
    try:
        train(cfg=cfg, groups=groups, device=device)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


if __name__ == "__main__":
    main()
