"""Benchmark: measured pipeline bubbles of real reference-GPT runs against the papers' theory.

    python benchmarks/bubbles.py [--repeat 3] [--steps 7]

Traces the reference GPT with trace-run (2 ranks, gloo, CPU) under GPipe, 1F1B and interleaved
1F1B (v=2), p=2, m=4, with stages balanced enough for the formulas to apply (8 layers, hidden
256: a pass takes tens of ms, a P2P message on loopback far less). For each schedule it prints,
as medians over the counted steps of all repeats and both ranks: the measured bubble, the
bubble replayed from the same passes with free communication (viz.analysis.timeline.replay), and the
theory ((p-1)/(m+p-1); interleaved (p-1)/(v m) of the ideal). The schedules run one after the other,
alternating, so that each sees the same machine; the load average is printed beside them.

Measured on a shared machine these numbers move with its load: that is why they are a
benchmark and not a test (tests check the analysis exactly on constructed traces).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from viz.analysis import analyse  # noqa: E402
from viz.run import open_run  # noqa: E402

MODEL = ["--tp", "1", "--pp", "2", "--layers", "8", "--hidden", "256", "--seq-len", "64",
         "--micro-batch-size", "8", "--microbatches", "4"]
SCHEDULES = {"gpipe": ["--schedule", "gpipe"], "1f1b": ["--schedule", "1f1b"],
             "interleaved": ["--schedule", "interleaved", "--virtual-stages", "2"]}


def trace(out: str, schedule: list, steps: int) -> str:
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    subprocess.run(["trace-run", "--nproc-per-node", "2", "--out", out, "--steps", "1-",
                    "--no-report", "-m", "sample_runs.train", *MODEL, "--steps", str(steps),
                    *schedule], check=True, env=env, cwd=REPO, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    return out


def step_bubbles(run_dir: str) -> tuple:
    """(measured, replayed) bubble of every counted step of every rank, and the theory."""
    analysis = analyse(open_run(run_dir))
    measured, replayed, theory = [], [], None
    for m in analysis.metrics.values():
        theory = m.theoretical_bubble_fraction
        for s in m.steps:
            if s.step in m.counted_steps and s.pipeline is not None:
                measured.append(s.pipeline.bubble_fraction)
                replayed.append(s.pipeline.simulated_bubble_fraction)
    return measured, [r for r in replayed if r is not None], theory


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--steps", type=int, default=7)
    args = parser.parse_args(argv)
    found = {name: ([], [], None) for name in SCHEDULES}
    loads = []
    with tempfile.TemporaryDirectory() as root:
        for i in range(args.repeat):
            for name, schedule in SCHEDULES.items():
                out = trace(os.path.join(root, f"{name}-{i}"), schedule, args.steps)
                loads.append(os.getloadavg()[0])
                measured, replayed, theory = step_bubbles(out)
                found[name][0].extend(measured)
                found[name][1].extend(replayed)
                found[name] = (found[name][0], found[name][1], theory)
    print(f"pipeline bubble, p=2 m=4, median over {args.repeat} runs x counted steps x 2 ranks "
          f"(load average {statistics.median(loads):.1f} on {os.cpu_count()} cores):")
    print(f"  {'schedule':<12}{'measured':>10}{'replayed':>10}{'theory':>9}")
    for name, (measured, replayed, theory) in found.items():
        print(f"  {name:<12}{statistics.median(measured):10.3f}"
              f"{statistics.median(replayed):10.3f}{theory:9.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
