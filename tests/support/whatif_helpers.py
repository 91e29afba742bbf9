"""Constructed recordings for the what-if tests: pipeline runs of the reference GPT's shape
with known pass times, written through constructed.synthetic (the recorder's own writer).

Each pass runs two matmuls per layer it holds, back to back (no host time between ops), in
the module of that layer (``GPTChunk.blocks.<i>.attn.qkv``, a column-parallel linear), each
taking time in proportion to its FLOPs (:data:`LAYER_OPS`), so the per-layer cost and the
time-against-FLOPs model are exact. The
times come from a dependency simulation of the schedule written here, independent of
viz.whatif: a pass starts when its rank is free and its input has arrived ``latency`` after
its producer ended; steps follow each other with no barrier between them (nothing but passes
in a step).
"""
from __future__ import annotations

from support.constructed.synthetic import SyntheticRank, write_run

U = 1_000              # one constructed unit: 1 us
BASE = 1_000_000_000

MODEL = {"layers": 4, "hidden": 64, "heads": 4, "seq_len": 64, "vocab": 256,
         "micro_batch_size": 2, "sp": False, "tp": 1, "dp": 1, "virtual_stages": 1}


# The ops of one layer's pass: (share of its time, input shapes). Each share is its FLOPs'
# share (2*m*k*n: forward 1.57M and 3.15M, backward twice that with k = 128), so with the
# backward costing twice the forward, time is exactly proportional to FLOPs.
LAYER_OPS = {"F": [(1 / 3, "f32[128,64] f32[64,96]"), (2 / 3, "f32[128,64] f32[64,192]")],
             "B": [(1 / 3, "f32[128,128] f32[128,96]"), (2 / 3, "f32[128,128] f32[128,192]")]}


def one_f_one_b(p: int, r: int, m: int) -> list:
    """(kind, micro-batch) of stage r under 1F1B (docs/oracles.md)."""
    warmup = min(p - r - 1, m)
    order = [("F", i) for i in range(warmup)]
    for i in range(m - warmup):
        order += [("F", warmup + i), ("B", i)]
    return order + [("B", i) for i in range(m - warmup, m)]


def gpipe(p: int, r: int, m: int) -> list:
    return [("F", i) for i in range(m)] + [("B", i) for i in range(m)]


def schedule_times(p: int, m: int, order, t_f: float, t_b: float, steps: int,
                   latency: float = 0.0) -> dict:
    """(rank, step, kind, mb) -> (posted, ready, end) over ``steps`` consecutive steps."""
    orders = {r: [(s, k, mb) for s in range(steps) for k, mb in order(p, r, m)]
              for r in range(p)}
    free, pos, done = {r: 0.0 for r in range(p)}, {r: 0 for r in range(p)}, {}
    moved = True
    while moved:
        moved = False
        for r in range(p):
            while pos[r] < len(orders[r]):
                s, kind, mb = orders[r][pos[r]]
                if kind == "F":
                    dep = (r - 1, s, "F", mb) if r > 0 else None
                else:
                    dep = (r + 1, s, "B", mb) if r < p - 1 else (r, s, "F", mb)
                if dep is not None and dep not in done:
                    break
                arrival = 0.0 if dep is None else done[dep][2] + (latency if dep[0] != r
                                                                  else 0.0)
                ready = max(free[r], arrival)
                end = ready + (t_f if kind == "F" else t_b)
                done[(r, s, kind, mb)] = (free[r], ready, end)
                free[r] = end
                pos[r] += 1
                moved = True
    return done


def pipeline_run(directory, *, p: int = 2, m: int = 4, schedule: str = "1f1b",
                 layer_f: float = 10.0, layer_b: float = 20.0, steps: int = 3,
                 latency: float = 0.0, layers: int = 4) -> str:
    """Write a p-stage run (tp 1, dp 1) of ``steps`` steps; returns the directory.
    Each layer costs ``layer_f`` units forward and ``layer_b`` backward."""
    order = {"1f1b": one_f_one_b, "gpipe": gpipe}[schedule]
    per = layers // p
    times = schedule_times(p, m, order, per * layer_f, per * layer_b, steps, latency)
    config = dict(MODEL, pp=p, microbatches=m, schedule=schedule, layers=layers)
    ranks = []
    for r in range(p):
        rank = SyntheticRank(r, p, config, unit_ns=U, base_ns=BASE)
        seq = 0
        for s in range(steps):
            mine = [(k, mb) for k, mb in order(p, r, m)]
            first = times[(r, s) + mine[0]][0]
            if s:
                rank.next_step(first)
            for kind, mb in mine:
                posted, ready, end = times[(r, s, kind, mb)]
                rank.annotate(kind, posted, end, microbatch=mb, chunk=0)
                source = r - 1 if kind == "F" else r + 1
                if 0 <= source < p:
                    rank.comm("recv", posted, posted, ready, peer=source, group=(0, 1),
                              nbytes=32768, phase="forward" if kind == "F" else "backward")
                cost = layer_f if kind == "F" else layer_b
                at = ready
                for layer in range(r * per, (r + 1) * per):
                    for share, shapes in LAYER_OPS[kind]:
                        rank.op(at, at + share * cost, name="aten.mm.default",
                                module=f"GPTChunk.blocks.{layer}.attn.qkv",
                                phase="forward" if kind == "F" else "backward", shapes=shapes)
                        at += share * cost
                target = r + 1 if kind == "F" else r - 1
                if 0 <= target < p:
                    # arrives ``latency`` later: the receive completes then
                    rank.comm("send", end, end, end + latency, peer=target, group=(0, 1),
                              nbytes=32768, phase="forward" if kind == "F" else "backward")
                seq += 1
        last = max(times[(r, steps - 1, k, mb)][2] for k, mb in order(p, r, m))
        rank.next_step(last)
        ranks.append(rank)
    return write_run(directory, ranks)
