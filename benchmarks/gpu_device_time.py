"""Device time as paratrace records it against torch.profiler's own export of the same run:
the reference GPT in one process on a GPU, the same configuration and steps under each, and
per step the GPU's compute time (the union of its non-NCCL kernels) from each recording.

Both sides are read with the same export parser (tracer.kineto.chrome_trace), but from different
data: paratrace's CUPTI windows (traces/rank-0.device.arrow) and one torch.profiler export taken
with the CUDA activity around the same loop. Steps are cut at the optimizer step's end, after a
synchronize, on the Unix clock both use.

    python benchmarks/gpu_device_time.py [--steps 5] [--model large] [--out DIR]

Prints per step: compute ms from paratrace, from torch.profiler, their ratio; then medians and
the worst ratio. Needs CUDA; on a machine without it, says so in one line and exits 2.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import tracer  # noqa: E402
from sample_runs.config import parse_config  # noqa: E402
from sample_runs.parallel.process_groups import single_process_groups  # noqa: E402
from sample_runs.train import train  # noqa: E402
from tracer.files.device_format import read_device  # noqa: E402
from tracer.files.device_format import KINDS
from tracer.kineto.chrome_trace import load_chrome_trace

MODELS = {
    "small": ["--layers", "4", "--heads", "4", "--hidden", "256", "--seq-len", "256"],
    "large": ["--layers", "8", "--heads", "16", "--hidden", "1024", "--seq-len", "1024"],
}
COMMON = ["--tp", "1", "--pp", "1", "--no-sp", "--micro-batch-size", "4", "--microbatches", "2",
          "--device", "cuda"]


def union_ns(starts: np.ndarray, ends: np.ndarray) -> int:
    """Length of the union of intervals."""
    if len(starts) == 0:
        return 0
    order = np.argsort(starts, kind="stable")
    total, cur_s, cur_e = 0, int(starts[order[0]]), int(ends[order[0]])
    for i in order[1:]:
        s, e = int(starts[i]), int(ends[i])
        if s > cur_e:
            total += cur_e - cur_s
            cur_s, cur_e = s, e
        elif e > cur_e:
            cur_e = e
    return total + cur_e - cur_s


def compute_per_step(records, edges: list) -> list:
    """Per step (between consecutive Unix-ns edges): union of non-NCCL kernels, clipped."""
    kernel = records.kind == KINDS.index("kernel")
    nccl = np.array(["nccl" in n.lower() for n in records.names] or [False])[records.name]
    keep = kernel & ~nccl
    starts, ends = records.start[keep], records.end[keep]
    out = []
    for lo, hi in zip(edges, edges[1:]):
        s, e = np.clip(starts, lo, hi), np.clip(ends, lo, hi)
        inside = e > s
        out.append(union_ns(s[inside], e[inside]) / 1e6)
    return out


def run(model: str, steps: int, recorder) -> list:
    """One run under ``recorder`` (a context factory); the Unix-ns edge of every step."""
    edges: list = []

    def stamp(*_):
        torch.cuda.synchronize()
        edges.append(time.time_ns())
    handle = register_optimizer_step_post_hook(stamp)
    cfg = parse_config(COMMON + MODELS[model] + ["--steps", str(steps)], world_size=1)
    try:
        with recorder():
            torch.cuda.synchronize()
            edges.append(time.time_ns())
            train(cfg=cfg, groups=single_process_groups(), device=torch.device("cuda"))
    finally:
        handle.remove()
    return edges


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--model", choices=sorted(MODELS), default="large")
    parser.add_argument("--out", default=None, help="where the recordings go (default: a temp "
                        "directory, removed)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_device_time.py: needs CUDA (no GPU visible)", file=sys.stderr)
        return 2
    out = args.out or tempfile.mkdtemp(prefix="gpu-device-time-")
    run(args.model, 2, lambda: torch.autograd.profiler.record_function("warm-up"))
    traces = os.path.join(out, "paratrace")
    ours = run(args.model, args.steps, lambda: tracer.trace(traces, clock_sync=False))
    records, _, problem = read_device(os.path.join(traces, "rank-0.device.arrow"))
    if problem:
        print(f"gpu_device_time.py: paratrace's device file: {problem}", file=sys.stderr)
    from torch.profiler import ProfilerActivity, profile
    prof = profile(activities=[ProfilerActivity.CUDA])
    theirs = run(args.model, args.steps, lambda: prof)
    export = os.path.join(out, "torch-profiler.json")
    prof.export_chrome_trace(export)
    a = compute_per_step(records, ours)
    b = compute_per_step(load_chrome_trace(export), theirs)
    print(f"model {args.model}, torch {torch.__version__}, {torch.cuda.get_device_name(0)}")
    print(f"{'step':>4}  {'paratrace ms':>12}  {'torch.profiler ms':>17}  {'ratio':>6}")
    ratios = []
    for i, (x, y) in enumerate(zip(a, b)):
        ratio = x / y if y else float("nan")
        ratios.append(ratio)
        print(f"{i:>4}  {x:>12.1f}  {y:>17.1f}  {ratio:>6.3f}")
    # step 0 warms the caches of each run: the medians leave it out
    print(f"median of steps 1-: paratrace {statistics.median(a[1:]):.1f} ms, torch.profiler "
          f"{statistics.median(b[1:]):.1f} ms, ratio {statistics.median(ratios[1:]):.3f}, "
          f"worst ratio {max(ratios[1:], key=lambda r: abs(r - 1)):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
