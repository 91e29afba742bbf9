"""Benchmark: the whole ``trace-report`` (every analysis, summary.json, every page) at scale.

    python benchmarks/analysis.py                      # 1M events over 4 ranks
    python benchmarks/analysis.py --scale 16m          # 16M events over 64 ranks (minutes)
    python benchmarks/analysis.py --scale reference    # a real traced reference-GPT run

The constructed runs (tests/support/constructed/workloads.py) train the 1F1B schedule with many
steps and micro-batches, P2P between stages and data-parallel all-reduces; their pipeline bubble is
known exactly ((p-1)/(m+p-1)), so each run also checks that the report measured it. ``reference``
traces the reference GPT (pp 2 x dp 2, 128 micro-batches, 8 layers, 2 steps: about 0.4M events)
with trace-run first (untimed).

Each measurement runs ``trace-report`` (``python -m viz.cli``, with this checkout first on
PYTHONPATH, its worker processes included, so the code measured is this checkout's, not whatever
is installed) in a fresh process, and prints the median over ``--repeat`` of its wall time,
events per second, and the peak resident memory of its largest process (the report process or
one of its workers), side by side for ``--jobs 1`` and the default (one worker per core).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "tests"))   # tests/support/constructed: the runs

from support.constructed.workloads import Pipeline, pipeline_run

SCALES = {
    # 4 ranks x ~250k events: 62 steps of 32 micro-batches, 60 ops a pass
    "1m": Pipeline(pp=4, dp=1, steps=62, microbatches=32, ops_per_pass=60),
    # 64 ranks (pp 8 x dp 8) x ~250k events
    "16m": Pipeline(pp=8, dp=8, steps=58, microbatches=32, ops_per_pass=60),
}
REFERENCE = ["--tp", "1", "--pp", "2", "--dp", "2", "--microbatches", "128", "--layers", "8",
             "--hidden", "64", "--seq-len", "32", "--micro-batch-size", "1", "--steps", "2"]
_MEASURE = ("import resource, subprocess, sys, time; t = time.perf_counter(); "
            "code = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL).returncode; "
            "print(code, time.perf_counter() - t, "
            "resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")


def measure(run_dir: str, report_dir: str, jobs: str) -> tuple:
    """(wall seconds, peak KiB of the largest process) of one trace-report, in a fresh process
    so the peak is this run's alone."""
    shutil.rmtree(report_dir, ignore_errors=True)
    cmd = [sys.executable, "-c", _MEASURE, sys.executable, "-m", "viz.cli", run_dir,
           "--out", report_dir]
    if jobs != "default":
        cmd += ["--jobs", jobs]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=_path()))
    code, wall, peak = proc.stdout.split()
    if code != "0":
        raise SystemExit(f"trace-report exited {code}: {proc.stderr[-2000:]}")
    return float(wall), int(peak)


def _path() -> str:
    """PYTHONPATH with this checkout first: the processes measured run its code."""
    return os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p)


def events_of(summary: dict) -> int:
    return sum(r.get("events", 0) for r in summary["ranks"].values())


def bubble_check(summary: dict, cfg: Pipeline) -> str:
    """Whether every rank's measured pipeline bubble is the constructed schedule's."""
    bubbles = [(r["time"]["pipeline"] or {}).get("bubble_fraction")
               for r in summary["ranks"].values()]
    off = [b for b in bubbles if b is None or abs(b - cfg.theoretical_bubble) > 1e-9]
    return (f"bubble {cfg.theoretical_bubble:.4f} on every rank, as constructed" if not off
            else f"BUBBLE MISMATCH: {len(off)} ranks differ from {cfg.theoretical_bubble:.4f}")


def trace_reference(directory: str) -> str:
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", PYTHONPATH=_path())
    subprocess.run([sys.executable, "-m", "instrument.launch", "--nproc-per-node", "4",
                    "--out", directory, "--no-report", "-m", "sample_runs.train", *REFERENCE],
                   check=True, env=env, cwd=REPO, stdout=subprocess.DEVNULL)
    return directory


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", choices=sorted(SCALES) + ["reference"], default="1m")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--keep", metavar="DIR", help="write the run here and keep it")
    args = parser.parse_args(argv)
    root = args.keep or tempfile.mkdtemp(prefix="paratrace-bench-")
    run_dir = os.path.join(root, "run")
    t = time.perf_counter()
    if not os.path.isdir(run_dir):
        if args.scale == "reference":
            trace_reference(run_dir)
        else:
            pipeline_run(os.path.join(run_dir, "traces"), SCALES[args.scale])
    print(f"{args.scale}: run in {run_dir} ready in {time.perf_counter() - t:.0f} s (untimed)")
    results = {}
    for jobs in ("1", "default"):
        runs = [measure(run_dir, os.path.join(root, "report"), jobs) for _ in range(args.repeat)]
        results[jobs] = (statistics.median(w for w, _ in runs), max(p for _, p in runs))
    with open(os.path.join(root, "report", "summary.json")) as fh:
        summary = json.load(fh)
    events = events_of(summary)
    print(f"{events:,} events over {len(summary['ranks'])} ranks; trace-report, median of "
          f"{args.repeat}, on {os.cpu_count()} cores (load average now "
          f"{os.getloadavg()[0]:.1f}):")
    print(f"  {'--jobs':<10}{'wall s':>9}{'events/s':>14}{'peak MiB':>10}")
    for jobs, (wall, peak) in results.items():
        print(f"  {jobs:<10}{wall:9.1f}{events / wall:14,.0f}{peak / 1024:10.0f}")
    if args.scale in SCALES:
        print("  " + bubble_check(summary, SCALES[args.scale]))
    if not args.keep:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
