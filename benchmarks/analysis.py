"""Benchmark: load, graph and render a synthetic 1,000,000-event run of 4 ranks.

    python benchmarks/analysis.py [--events 1000000] [--ranks 4] [--repeat 3] [--budget 15]

Writes real trace files with tracer.format.TraceWriter (untimed), then times, per repeat:
loading them (viz.run.open_run), aggregating events (viz.groups.op_groups), building the
merged and per-rank call graphs, pruning them and rendering each to SVG with graphviz dot.
Prints the median wall time of every stage, the CPU seconds used (this process and dot),
events per second, and exits 1 if the median wall total exceeds the budget (seconds).

The synthetic run looks like a real one where it matters for speed: 3,000 unique stacks
per rank drawn from a call tree with shared prefixes, 8,000 distinct event kinds (stack,
forward stack, op, shapes, module) per rank with Zipf-distributed frequencies, a third of them
backward, collectives among the ops.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np

from tracer.format import COLUMNS, TraceWriter
from viz.callgraph import build_callgraph, prune
from viz.render.callgraph_svg import render_svg, to_dot
from viz.source import display_paths
from viz.groups import op_groups
from viz.run import open_run

BATCH = 200_000
OPS = [f"aten.op{i}.default" for i in range(60)] + ["aten.mm.default", "aten.addmm.default"]
COMMS = [("c10d.allreduce_.default", "all_reduce"), ("c10d._allgather_base_.default",
         "all_gather"), ("c10d._reduce_scatter_base_.default", "reduce_scatter"),
         ("c10d.send.default", "send"), ("c10d.recv_.default", "recv")]


def _call_tree(rng: np.random.Generator, stacks: int) -> list:
    """Unique stacks (JSON, innermost first) from a random call tree with shared prefixes."""
    files = [f"/src/project/pkg{i % 8}/mod{i}.py" for i in range(40)]
    functions = [(files[i % 40], f"Class{i % 30}.fn{i}") for i in range(400)]
    root = [["/src/project/train.py", 10, "<module>", "<module>"],
            ["/src/project/train.py", 80, "main", "main"],
            ["/src/project/train.py", 120, "train", "train"]]
    paths = [root]
    out = []
    while len(out) < stacks:
        parent = paths[int(rng.integers(len(paths)))]
        if len(parent) >= 18:
            continue
        file, qual = functions[int(rng.integers(len(functions)))]
        child = parent + [[file, int(rng.integers(1, 400)), qual.split(".")[-1], qual]]
        paths.append(child)
        boundary = ["/usr/lib/python3/site-packages/torch/nn/functional.py", 2000, "linear",
                    "linear"]
        out.append(json.dumps(([boundary] if rng.random() < 0.5 else []) + child[::-1]))
    return out


def _templates(rng: np.random.Generator, stacks: int, count: int = 8000) -> dict:
    """Distinct event kinds: as in a real run, the call site mostly decides op, shapes and
    module, so a few thousand kinds make up millions of events."""
    op = rng.integers(0, len(OPS) + len(COMMS), count)
    backward = rng.random(count) < 0.35
    return {"op": op, "phase": np.where(backward, 2, 1), "module": rng.integers(0, 200, count),
            "stack": rng.integers(0, stacks, count),
            "fwd_stack": np.where(backward, rng.integers(0, stacks, count), -1),
            "shapes": rng.integers(0, 500, count),
            "kind": np.where(op >= len(OPS), op - len(OPS), -1)}


def write_synthetic(out_dir: str, events: int, ranks: int, seed: int = 0) -> None:
    """``ranks`` trace files of ``events`` events in total."""
    rng = np.random.default_rng(seed)
    per_rank = events // ranks
    for rank in range(ranks):
        stacks = _call_tree(rng, 3000)
        names = OPS + [op for op, _ in COMMS] + ["paratrace::step"]
        dictionaries = {
            "op": names, "stack": stacks, "fwd_stack": stacks,
            "module": [f"GPT.blocks.{i // 10}.layer{i % 10}" for i in range(200)],
            "annotation": [json.dumps([{"label": "F", "microbatch": i}]) for i in range(8)],
            "shapes": [f"f32[{8 * (1 + i % 16)},64] f32[64,{16 * (1 + i // 16)}]"
                       for i in range(500)],
            "kind": [kind for _, kind in COMMS], "group": ["0,1,2,3", "0,1", "2,3"],
            "dtype": ["f32"]}
        meta = {"rank": rank, "world_size": ranks, "start_ns": 0, "config": {"synthetic": True}}
        writer = TraceWriter(os.path.join(out_dir, f"rank-{rank}.arrow"), meta)
        templates = _templates(rng, len(stacks))
        # Hot call sites dominate a real run (the layers' matmuls, the TP collectives).
        popularity = 1.0 / np.arange(1, len(templates["op"]) + 1) ** 1.1
        popularity /= popularity.sum()
        t = 0
        for start in range(0, per_rank, BATCH):
            n = min(BATCH, per_rank - start)
            which = rng.choice(len(popularity), n, p=popularity)
            pick = {name: col[which] for name, col in templates.items()}
            is_comm = pick["kind"] >= 0
            t0 = t + np.cumsum(rng.integers(1_000, 50_000, n))
            t = int(t0[-1])
            cols = {
                **pick, "t0": t0, "t1": t0 + rng.integers(500, 40_000, n),
                "annotation": rng.integers(0, 8, n), "step": np.full(n, start * 4 // per_rank),
                "thread": np.zeros(n, dtype=np.int64), "group": np.where(is_comm, 0, -1),
                "peer": np.full(n, -1),
                "bytes": np.where(is_comm, rng.integers(1, 1 << 20, n), -1),
                "dtype": np.where(is_comm, 0, -1), "async_op": np.full(n, -1),
                "seq": np.where(is_comm, np.arange(n), -1), "cid": np.full(n, -1),
                "t_ret": np.full(n, -1)}
            lists = [[None if v == -1 and name not in ("t0", "step", "phase", "thread") else v
                      for v in cols[name].tolist()] for name, _ in COLUMNS]
            writer.write(list(zip(*lists)), dictionaries,
                         meta={"status": "ok"} if start + BATCH >= per_rank else None)
        writer.close()


def run_once(run_dir: str, out_dir: str) -> dict:
    """Seconds of each stage of one load -> graphs -> SVG pass."""
    times = {}
    cpu = os.times()
    t = time.perf_counter()
    run = open_run(run_dir)
    traces = {rank: run.load(rank) for rank in run.files}
    times["load"] = time.perf_counter() - t
    t = time.perf_counter()
    groups = {rank: op_groups(trace) for rank, trace in traces.items()}
    times["aggregate"] = time.perf_counter() - t
    t = time.perf_counter()
    world = tuple(range(run.world_size_hint))
    merged = [g for rank in sorted(groups) for g in groups[rank]]
    graphs = [build_callgraph(merged, world=world)] + \
        [build_callgraph(groups[r], world=world) for r in sorted(groups)]
    times["graph"] = time.perf_counter() - t
    t = time.perf_counter()
    pruned = [prune(g) for g in graphs]
    times["prune"] = time.perf_counter() - t
    t = time.perf_counter()
    paths = display_paths({f.file for g in merged for f in g.path})
    for i, g in enumerate(pruned):
        svg = render_svg(to_dot(g, title=f"graph {i}", paths=paths, href=lambda f, l: None))
        with open(os.path.join(out_dir, f"graph-{i}.svg"), "w") as fh:
            fh.write(svg)
    times["svg"] = time.perf_counter() - t
    times["total"] = sum(times.values())
    end = os.times()
    # CPU seconds of this process and of dot: wall time on a shared machine includes waiting.
    times["cpu"] = sum(end[i] - cpu[i] for i in range(4))
    times["events"] = sum(len(tr) for tr in traces.values())
    times["groups"] = len(merged)
    times["nodes"] = max(g.graph.number_of_nodes() for g in pruned)
    return times


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--budget", type=float, default=15.0, help="seconds for the median total")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        run_dir, out_dir = os.path.join(tmp, "traces"), os.path.join(tmp, "out")
        os.makedirs(run_dir)
        os.makedirs(out_dir)
        t = time.perf_counter()
        write_synthetic(run_dir, args.events, args.ranks)
        print(f"wrote {args.events:,} events over {args.ranks} ranks in "
              f"{time.perf_counter() - t:.1f} s (untimed setup)")
        runs = [run_once(run_dir, out_dir) for _ in range(args.repeat)]
    stages = ("load", "aggregate", "graph", "prune", "svg", "total", "cpu")
    median = {s: statistics.median(r[s] for r in runs) for s in stages}
    events = runs[0]["events"]
    print(f"{events:,} events, {runs[0]['groups']:,} op groups, largest SVG "
          f"{runs[0]['nodes']} nodes; median of {args.repeat}:")
    for stage in stages:
        print(f"  {stage:<10} {median[stage]:7.2f} s")
    print(f"events per second: {events / median['total']:,.0f} (wall), "
          f"{events / median['cpu']:,.0f} (per CPU second)")
    print(f"load average during the run: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    ok = median["total"] <= args.budget
    print(f"budget {args.budget:.0f} s: {'ok' if ok else 'EXCEEDED'} "
          f"(ratio {median['total'] / args.budget:.2f})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
