"""Constructed pipeline-parallel training runs of any size, for benchmarks and scale tests.

:func:`pipeline_run` writes the traces of ``pp`` pipeline stages x ``dp`` data-parallel
replicas training ``steps`` iterations of the 1F1B schedule with ``microbatches`` micro-batches:
every pass annotated (F/B, micro-batch), ``ops_per_pass`` compute ops in it drawn from a pool of
call sites (stacks, modules, shapes, forward and backward; the same draws on every replica of a
stage, as data-parallel replicas run the same code), a send and a receive per stage
boundary, the gradient all-reduce of each data-parallel group in buckets, step markers. Times
come from the schedule's dependency simulation (a pass starts when its rank is free and its
input has arrived ``latency`` after it was sent), so the pipeline bubble of every rank is known:
with ``latency=0`` it is exactly (p-1)/(m+p-1), the papers' 1F1B bubble.

Columns are generated with numpy and written through :meth:`TraceWriter.write_columns`, so 16M
events take seconds, not minutes. Torch-free.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass

import numpy as np

from tracer.files import rundir
from tracer.files.format import FORMAT_VERSION, TraceWriter
from tracer.vocab import ops
from tracer.vocab.groups import group_text
from tracer.vocab.labels import PHASE_BACKWARD, PHASE_FORWARD, PHASE_OTHER

BATCH_ROWS = 200_000
_COMPUTE_OPS = ["aten.mm.default", "aten.addmm.default", "aten.add.Tensor", "aten.mul.Tensor",
                "aten.gelu.default", "aten.native_layer_norm.default", "aten.view.default",
                "aten._softmax.default", "aten.bmm.default", "aten.t.default"]
_KIND_OPS = {"send": "c10d.send.default", "recv": "c10d.recv_.default",
             "all_reduce": "c10d.allreduce_.default"}


@dataclass(frozen=True)
class Pipeline:
    """The sizes of a constructed run; times are integer nanoseconds."""

    pp: int = 4
    dp: int = 1
    steps: int = 4
    microbatches: int = 8
    ops_per_pass: int = 40
    t_f: int = 400_000            # one forward pass of one micro-batch on one stage
    t_b: int = 800_000
    latency: int = 0              # a P2P message's flight time
    buckets: int = 4              # DP gradient all-reduces per step
    bucket_ns: int = 100_000
    sites: int = 400              # distinct call sites (stacks) per rank

    @property
    def world(self) -> int:
        return self.pp * self.dp

    def rank(self, stage: int, replica: int) -> int:
        """Megatron's order with tp 1: global = dp + d * pp."""
        return replica + self.dp * stage

    @property
    def theoretical_bubble(self) -> float:
        return (self.pp - 1) / (self.microbatches + self.pp - 1)


def one_f_one_b(p: int, stage: int, m: int) -> list:
    """(kind, microbatch) in the order stage ``stage`` runs them (docs/oracles.md)."""
    warmup = min(p - stage - 1, m)
    order = [("F", i) for i in range(warmup)]
    f, b = warmup, 0
    while b < m:
        if f < m:
            order.append(("F", f))
            f += 1
        order.append(("B", b))
        b += 1
    return order


def simulate(cfg: Pipeline, start: int) -> dict:
    """(stage, kind, microbatch) -> (posted, ready, end): when the pass began waiting for its
    input, when the input was there, when it ended; one step from ``start``."""
    orders = [one_f_one_b(cfg.pp, s, cfg.microbatches) for s in range(cfg.pp)]
    free, position, done = [start] * cfg.pp, [0] * cfg.pp, {}
    progress = True
    while progress:
        progress = False
        for s in range(cfg.pp):
            while position[s] < len(orders[s]):
                kind, mb = orders[s][position[s]]
                dep = (s - 1, "F", mb) if kind == "F" else (
                    (s + 1, "B", mb) if s < cfg.pp - 1 else (s, "F", mb))
                if kind == "F" and s == 0:
                    dep = None
                if dep is not None and dep not in done:
                    break
                arrival = start if dep is None else done[dep][2] + (
                    cfg.latency if dep[0] != s else 0)
                ready = max(free[s], arrival)
                end = ready + (cfg.t_f if kind == "F" else cfg.t_b)
                done[(s, kind, mb)] = (free[s], ready, end)
                free[s] = end
                position[s] += 1
                progress = True
    return done


class _Columns:
    """Growing numpy columns of one rank; a column a row does not set is null (-1)."""

    def __init__(self):
        self.parts: dict = {}
        self.rows = 0

    def add(self, **cols) -> None:
        n = max(len(np.atleast_1d(v)) for v in cols.values())
        for name, value in cols.items():
            if name not in self.parts:
                self.parts[name] = [np.full(self.rows, -1)]
            self.parts[name].append(np.broadcast_to(np.asarray(value), (n,)))
        for name in self.parts:
            if name not in cols:
                self.parts[name].append(np.full(n, -1))
        self.rows += n

    def arrays(self) -> dict:
        return {name: np.concatenate(chunks).astype(np.int64) for name, chunks in
                self.parts.items()}


def pipeline_run(directory: str, cfg: Pipeline = Pipeline(), seed: int = 0) -> str:
    """Write ``directory/rank-<R>.arrow`` for every rank of ``cfg``; returns the directory."""
    os.makedirs(directory, exist_ok=True)
    dicts = _dictionaries(cfg)
    step_len = max(end for _, _, end in simulate(cfg, 0).values()) \
        + cfg.buckets * cfg.bucket_ns + 50_000
    schedules = [simulate(cfg, 1_000_000 + (k + 1) * step_len) for k in range(cfg.steps)]
    weights = 1.0 / np.arange(1, cfg.sites + 1) ** 1.1
    weights /= weights.sum()
    for replica in range(cfg.dp):
        for stage in range(cfg.pp):
            rng = np.random.default_rng((seed, stage))    # a stage's replicas: the same ops
            cols = _rank_columns(cfg, stage, replica, schedules, step_len, dicts, rng, weights)
            _write(directory, cfg, cfg.rank(stage, replica), cols, dicts)
    return directory


def _dictionaries(cfg: Pipeline) -> dict:
    files = [f"/src/model/layer{i}.py" for i in range(12)]
    stacks = []
    for i in range(cfg.sites):
        depth = 3 + i % 6
        frames = [[files[(i + d) % 12], 10 + (i * 7 + d) % 300, f"fn{(i + d) % 40}",
                   f"Block{d}.fn{(i + d) % 40}"] for d in range(depth)]
        frames.append(["/src/train.py", 120, "train", "train"])
        stacks.append(json.dumps(frames, separators=(",", ":")))
    passes = [json.dumps([{"label": k, "microbatch": mb, "chunk": 0}], separators=(",", ":"))
              for k in "FB" for mb in range(cfg.microbatches)]
    groups = [group_text([cfg.rank(s, d) for s in range(cfg.pp)]) for d in range(cfg.dp)]
    groups += [group_text([cfg.rank(s, d) for d in range(cfg.dp)]) for s in range(cfg.pp)]
    return {"op": _COMPUTE_OPS + [ops.OP_ANNOTATION, ops.OP_STEP] + list(_KIND_OPS.values()),
            "stack": stacks, "fwd_stack": stacks, "annotation": passes,
            "module": [f"GPT.blocks.{i}.{part}" for i in range(8)
                       for part in ("attn", "mlp", "ln")],
            "shapes": [f"f32[{16 * (1 + i % 8)},256] f32[256,{64 * (1 + i // 8)}]"
                       for i in range(64)],
            "kind": list(_KIND_OPS), "group": groups, "dtype": ["f32"]}


def _rank_columns(cfg, stage, replica, schedules, step_len, dicts, rng, weights) -> dict:
    code = {name: i for i, name in enumerate(dicts["op"])}
    kind = {k: i for i, k in enumerate(dicts["kind"])}
    pipe_group, dp_group = replica, cfg.dp + stage
    out = _Columns()
    out.add(t0=np.arange(20) * 10_000 + 100_000, t1=np.arange(20) * 10_000 + 108_000,
            op=code["aten.mm.default"], phase=PHASE_OTHER, step=0,
            stack=rng.choice(cfg.sites, 20, p=weights))          # step 0: setup
    seq = {"pipe": 0, "dp": 0}
    for k, schedule in enumerate(schedules, start=1):
        step_start = 1_000_000 + k * step_len
        out.add(t0=step_start, t1=step_start, op=code[ops.OP_STEP], step=k, phase=PHASE_OTHER)
        for kind_name, mb in one_f_one_b(cfg.pp, stage, cfg.microbatches):
            posted, ready, end = schedule[(stage, kind_name, mb)]
            forward = kind_name == "F"
            label = mb if forward else cfg.microbatches + mb
            out.add(t0=posted, t1=end, op=code[ops.OP_ANNOTATION], annotation=label, step=k,
                    phase=PHASE_FORWARD if forward else PHASE_BACKWARD)
            peer_in = stage - 1 if forward else stage + 1
            if 0 <= peer_in < cfg.pp:
                out.add(t0=posted, t_ret=posted, t1=ready, op=code[_KIND_OPS["recv"]],
                        kind=kind["recv"], group=pipe_group, peer=cfg.rank(peer_in, replica),
                        bytes=65536, dtype=0, seq=seq["pipe"], step=k, annotation=label,
                        phase=PHASE_FORWARD if forward else PHASE_BACKWARD)
                seq["pipe"] += 1
            n = cfg.ops_per_pass
            edges = ready + (end - ready) * np.arange(n + 1) // n
            sites = rng.choice(cfg.sites, n, p=weights)
            out.add(t0=edges[:-1], t1=edges[1:], op=sites % len(_COMPUTE_OPS), stack=sites,
                    fwd_stack=-1 if forward else (sites + 1) % cfg.sites,
                    module=sites % len(dicts["module"]), shapes=sites % len(dicts["shapes"]),
                    phase=PHASE_FORWARD if forward else PHASE_BACKWARD, step=k,
                    annotation=label)
            peer_out = stage + 1 if forward else stage - 1
            if 0 <= peer_out < cfg.pp:
                arrival = end + cfg.latency
                out.add(t0=end, t_ret=end, t1=arrival, op=code[_KIND_OPS["send"]],
                        kind=kind["send"], group=pipe_group, peer=cfg.rank(peer_out, replica),
                        bytes=65536, dtype=0, seq=seq["pipe"], step=k, annotation=label,
                        phase=PHASE_FORWARD if forward else PHASE_BACKWARD)
                seq["pipe"] += 1
        sync = max(e[2] for e in schedule.values())
        for b in range(cfg.buckets):
            t0 = sync + b * cfg.bucket_ns
            out.add(t0=t0, t_ret=t0 + 1_000, t1=t0 + cfg.bucket_ns,
                    op=code[_KIND_OPS["all_reduce"]], kind=kind["all_reduce"], group=dp_group,
                    bytes=1 << 20, dtype=0, seq=seq["dp"], step=k, phase=PHASE_OTHER)
            seq["dp"] += 1
    cols = out.arrays()
    cols["thread"] = np.zeros_like(cols["t0"])
    cols["async_op"] = np.where(cols["kind"] >= 0, 0, -1)
    cols["cid"] = np.where(cols["kind"] >= 0, np.cumsum(cols["kind"] >= 0) - 1, -1)
    return cols


def _write(directory: str, cfg: Pipeline, rank: int, cols: dict, dicts: dict) -> None:
    meta = {"format_version": FORMAT_VERSION, "rank": rank, "world_size": cfg.world,
            "start_ns": 0, "host": "constructed", "backend": "synthetic"}
    writer = TraceWriter(rundir.trace_file(directory, rank), meta)
    order = np.argsort(np.where(cols["t1"] >= 0, cols["t1"], cols["t0"]), kind="stable")
    cols = {name: col[order] for name, col in cols.items()}
    total = len(order)
    config = {"pp": cfg.pp, "dp": cfg.dp, "tp": 1, "schedule": "1f1b",
              "microbatches": cfg.microbatches, "virtual_stages": 1, "steps": cfg.steps,
              "synthetic": True}
    for start in range(0, total, BATCH_ROWS):
        part = {name: col[start:start + BATCH_ROWS] for name, col in cols.items()}
        last = start + BATCH_ROWS >= total
        writer.write_columns(part, dicts, {"config": config, "status": "ok"} if last else None)
    writer.close()
