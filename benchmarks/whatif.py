"""Benchmark: trace-whatif's predictions against real runs of the reference GPT.

    python benchmarks/whatif.py [--repeat 3] [--steps 7] [--model default|tiny] [--keep DIR]
                                [--warmup 1] [--detail]
    python benchmarks/whatif.py --reuse DIR [--detail]     # predict again from kept runs
    python benchmarks/whatif.py --memory --repeat 1         # also peak memory per rank

Each repeat records two base configurations with trace-run (2 ranks, gloo, CPU,
OMP_NUM_THREADS=1): A = pp 2 (1F1B, m=4) and B = dp 2, then runs every target configuration
for real, traced the same way, and compares the prediction made from the base with the real
run's measurement (viz.whatif.replay.measures: the slowest rank's mean counted step, the share of
the step without compute, averaged over ranks). Targets, all on 2 ranks (4 processes on 2
cores would make contention dominate: the pipeline and tensor degree changes keep the world
at 2 by moving the data-parallel degree the other way):

- replay: each recording replayed against its own measurement (Lumos' replay error);
- schedule: A -> GPipe, interleaved (v=2), ZB-H1; micro-batches: A -> m=8;
- pipeline and data degree: A -> pp 1 (dp 2); B -> pp 2 (dp 1);
- tensor degree: A -> tp 2 + SP (pp 1, dp 1); B -> tp 2 + SP (dp 1).

The runs of one repeat alternate, so every configuration sees the same machine; the load average
before the first run is printed. The two bases run once first, not counted (--warmup): on a machine
that sat idle the first runs were 13-25 % slower (the first repeat's pp 2 base 684 ms against 545
and 503 in the next two). Errors are medians over repeats: step error is predicted / real - 1,
bubble error predicted - real in points. Predictions and real runs are both traced (the recording's
durations carry the tracer's cost, so the prediction is of a traced step). With --memory every run
records memory (trace-run's default; without --memory the runs use --no-memory: slower steps,
so the step table is not comparable with one without it) and a second table sets each target's predicted peak per rank
(viz.whatif.reference_gpt.gpt_memory) beside the real run's: the median and the worst rank's error
(goal: within 10 %). Memory does not depend on the machine's load: one repeat is enough. Default
sizes (8 layers, hidden 256, seq 64, micro-batch 8) take about 4 minutes at --repeat 3 on a quiet
2-core machine (more under load); --model tiny checks the script in about a minute.
"""
from __future__ import annotations

import argparse
import datetime
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from viz.analysis import analyse  # noqa: E402
from viz.run import open_run  # noqa: E402
from viz.whatif import what_if  # noqa: E402
from viz.whatif.replay.measures import measures  # noqa: E402

MODELS = {"default": ["--layers", "8", "--hidden", "256", "--heads", "4", "--seq-len", "64",
                      "--micro-batch-size", "8"],
          "tiny": ["--layers", "4", "--hidden", "32", "--heads", "4", "--seq-len", "16",
                   "--micro-batch-size", "2"]}
BASES = {"A": {"tp": 1, "pp": 2, "dp": 1, "schedule": "1f1b", "microbatches": 4},
         "B": {"tp": 1, "pp": 1, "dp": 2, "schedule": "1f1b", "microbatches": 4}}
# (name, kind, base, changes); kind: the accuracy class of docs/whatif.md
TARGETS = [("A -> gpipe", "schedule", "A", {"schedule": "gpipe"}),
           ("A -> interleaved v2", "schedule", "A", {"schedule": "interleaved",
                                                     "virtual_stages": 2}),
           ("A -> zb-h1", "schedule", "A", {"schedule": "zb-h1"}),
           ("A -> m 8", "microbatches", "A", {"microbatches": 8}),
           ("A -> pp 1, dp 2", "pipeline/data", "A", {"pp": 1}),
           ("B -> pp 2, dp 1", "pipeline/data", "B", {"pp": 2}),
           ("A -> tp 2+sp, pp 1", "tensor", "A", {"tp": 2, "pp": 1, "sp": True}),
           ("B -> tp 2+sp, dp 1", "tensor", "B", {"tp": 2, "sp": True})]
GOALS = {"replay": 0.03, "schedule": 0.10, "microbatches": 0.10, "pipeline/data": 0.15,
         "tensor": 0.15}


def flags(config: dict) -> list:
    out = ["--tp", str(config["tp"]), "--pp", str(config["pp"]), "--dp", str(config["dp"]),
           "--schedule", config["schedule"], "--microbatches", str(config["microbatches"])]
    if config.get("virtual_stages", 1) > 1:
        out += ["--virtual-stages", str(config["virtual_stages"])]
    out.append("--sp" if config.get("sp", True) else "--no-sp")
    return out


def key(config: dict) -> tuple:
    """What tells two configurations apart (SP matters only with TP)."""
    return (config["tp"], config["pp"], config["dp"], config["schedule"],
            config["microbatches"], config.get("virtual_stages", 1),
            bool(config.get("sp", True)) and config["tp"] > 1)


MEMORY = False          # --memory: every run records memory
MEMORY_GOAL = 0.10


def trace(out: str, config: dict, model: list, steps: int) -> str:
    """Trace one configuration on 2 ranks, recording from step 2 (the first steps are
    slower: allocator, caches, gloo's first messages); returns the run directory."""
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", PYTHONPATH=REPO)
    proc = subprocess.run(
        [sys.executable, "-m", "instrument.launch", "--nproc-per-node", "2", "--out", out,
         "--steps", "2-", "--no-report", *([] if MEMORY else ["--no-memory"]),
         "-m", "sample_runs.train", *model,
         "--steps", str(steps), *flags(config)],
        env=env, cwd=REPO, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"trace-run failed for {flags(config)}: {proc.stderr[-2000:]}")
    return out


def target_config(base: dict, changes: dict) -> dict:
    """As trace-whatif reads a target: dp follows the world of 2 unless named."""
    cfg = {"virtual_stages": 1, "sp": True, **base, **changes}
    if "schedule" in changes and changes["schedule"] != "interleaved":
        cfg["virtual_stages"] = 1
    if "dp" not in changes:
        cfg["dp"] = 2 // (cfg["tp"] * cfg["pp"])
    return cfg


def one_repeat(root: str, i: int, model: list, steps: int, found: dict) -> None:
    """Record the bases and every target for real, alternating; predict each target from
    its base and pair the prediction with the real run's measures."""
    configs = {}
    for base in BASES.values():
        configs[key(target_config(base, {}))] = target_config(base, {})
    for _, _, base, changes in TARGETS:
        cfg = target_config(BASES[base], changes)
        configs.setdefault(key(cfg), cfg)
    runs = {k: analyse(open_run(trace(os.path.join(root, f"{i}-{n}"), cfg, model, steps)))
            for n, (k, cfg) in enumerate(configs.items())}
    evaluate(runs, found)


def reused_repeats(root: str) -> list:
    """The repeats a --keep directory holds: per repeat, config key -> analysed run."""
    repeats: dict = {}
    for name in sorted(os.listdir(root)):
        i, _, n = name.partition("-")
        if not (i.isdigit() and n.isdigit()):
            continue
        analysis = analyse(open_run(os.path.join(root, name)))
        config = {k: analysis.config.get(k) for k in ("tp", "pp", "dp", "schedule",
                                                      "microbatches", "virtual_stages", "sp")}
        repeats.setdefault(int(i), {})[key(config)] = analysis
    return [runs for _, runs in sorted(repeats.items())]


def evaluate(runs: dict, found: dict) -> None:
    """Predict each target from its base's run (``runs``: config key -> analysis) and pair
    the prediction with the real run's measures."""
    for name, base in BASES.items():
        mine = [t for t in TARGETS if t[2] == name]
        result = what_if(runs[key(target_config(base, {}))], [t[3] for t in mine])
        found.setdefault(f"{name} replayed", ("replay", []))[1].append(
            (result.replayed, result.measured))
        if result.memory is not None:
            found.setdefault("memory", {}).setdefault(f"{name} replayed", []).append(
                (result.memory_replayed, result.memory))
        for (label, kind, _, changes), prediction in zip(mine, result.targets):
            real = runs[key(target_config(base, changes))]
            found.setdefault(label, (kind, []))[1].append(
                (prediction.measures, measures(real.metrics)))
            if prediction.memory is not None:
                found.setdefault("memory", {}).setdefault(label, []).append(
                    (prediction.memory, real_peaks(real)))


def real_peaks(analysis) -> dict:
    """rank -> {peak_bytes} of a real run recorded with memory."""
    return {str(r): {"peak_bytes": mine.memory.peak_bytes}
            for r, mine in analysis.ranks.items() if mine.memory is not None}


def memory_table(pairs_by_target: dict) -> str:
    """Per target: predicted and real peak (the largest rank's), the median and the worst
    rank's error over every rank and repeat."""
    lines = [f"peak memory per rank, predicted against real (goal {100 * MEMORY_GOAL:.0f} %)",
             f"{'target':<22}{'pred peak':>11}{'real peak':>11}{'median err':>11}"
             f"{'worst err':>10}{'goal':>6}"]
    for label, pairs in pairs_by_target.items():
        errors, pred_top, real_top = [], [], []
        for predicted, real in pairs:
            common = sorted(set(predicted) & set(real), key=int)
            errors += [predicted[r]["peak_bytes"] / real[r]["peak_bytes"] - 1 for r in common]
            pred_top.append(max(predicted[r]["peak_bytes"] for r in common))
            real_top.append(max(real[r]["peak_bytes"] for r in common))
        worst = max(errors, key=abs)
        ok = "yes" if abs(worst) <= MEMORY_GOAL else "NO"
        lines.append(f"{label:<22}{statistics.median(pred_top) / 2**20:9.2f}Mi"
                     f"{statistics.median(real_top) / 2**20:9.2f}Mi"
                     f"{100 * statistics.median(errors):+10.1f}%{100 * worst:+9.1f}%   {ok}")
    return "\n".join(lines)


def table(found: dict, repeats: int, loads) -> str:
    """The medians over repeats; ``loads``: (the load average before the first run, after
    each repeat), or None for runs reused from a --keep directory."""
    where = "reused runs" if loads is None else (
        f"load average {loads[0]:.2f} before, {statistics.median(loads[1]):.1f} while running "
        f"(the benchmark's own 2 ranks), {os.cpu_count()} cores")
    lines = [f"trace-whatif against real runs, {datetime.date.today()}, medians over {repeats} "
             f"repeat(s), 2 ranks each ({where})",
             f"{'target':<22}{'class':<15}{'pred step':>10}{'real step':>10}{'step err':>9}"
             f"{'pred bub':>9}{'real bub':>9}{'bub err':>8}{'goal':>6}"]
    for label, (kind, pairs) in ((k, v) for k, v in found.items() if k != "memory"):
        pred = [p["step_s"] for p, _ in pairs]
        real = [r["step_s"] for _, r in pairs]
        err = [p / r - 1 for p, r in zip(pred, real)]
        bp = [p["bubble_fraction"] for p, _ in pairs]
        br = [r["bubble_fraction"] for _, r in pairs]
        middle = statistics.median(err)
        ok = "yes" if abs(middle) <= GOALS[kind] else "NO"
        lines.append(f"{label:<22}{kind:<15}{1e3 * statistics.median(pred):9.1f}m"
                     f"{1e3 * statistics.median(real):9.1f}m{100 * middle:+8.1f}%"
                     f"{statistics.median(bp):9.3f}{statistics.median(br):9.3f}"
                     f"{100 * statistics.median(b - c for b, c in zip(bp, br)):+7.1f}p"
                     f"{100 * GOALS[kind]:5.0f}% {ok}")
    return "\n".join(lines)


def detail(found: dict) -> str:
    """Every repeat's step and bubble errors, to see the spread behind the medians."""
    lines = ["per repeat: step error % (bubble error p)"]
    for label, (_, pairs) in ((k, v) for k, v in found.items() if k != "memory"):
        cells = [(100 * (p["step_s"] / r["step_s"] - 1),
                  100 * (p["bubble_fraction"] - r["bubble_fraction"])) for p, r in pairs]
        lines.append(f"{label:<22}" + "  ".join(f"{step:+6.1f} ({bubble:+5.1f})"
                                                 for step, bubble in cells))
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="repeats (default 3)")
    parser.add_argument("--steps", type=int, default=7,
                        help="steps per run; steps 2.. are recorded and counted (default 7)")
    parser.add_argument("--model", choices=sorted(MODELS), default="default",
                        help="model size (default: 8 layers, hidden 256; tiny: a quick check)")
    parser.add_argument("--keep", metavar="DIR", help="keep the runs in DIR")
    parser.add_argument("--reuse", metavar="DIR", help="predict again from the runs a "
                        "--keep DIR holds, running nothing (to try a change of the models)")
    parser.add_argument("--detail", action="store_true", help="also print every repeat's errors")
    parser.add_argument("--memory", action="store_true", help="record memory in every run and "
                        "check the predicted peak per rank against it")
    parser.add_argument("--warmup", type=int, default=1, metavar="N",
                        help="runs of the two bases first, not counted (default 1: the first "
                        "runs on a machine that sat idle are slower)")
    args = parser.parse_args(argv)
    global MEMORY
    MEMORY = args.memory
    found: dict = {}
    loads = []
    start = time.monotonic()
    if args.reuse:
        repeats = reused_repeats(args.reuse)
        if not repeats:
            raise SystemExit(f"{args.reuse}: no runs of benchmarks/whatif.py --keep in it")
        for runs in repeats:
            evaluate(runs, found)
        print(table(found, len(repeats), None))
        if found.get("memory"):
            print(memory_table(found["memory"]))
    else:
        root = args.keep or tempfile.mkdtemp(prefix="whatif-bench-")
        os.makedirs(root, exist_ok=True)
        before = os.getloadavg()[0]
        for i in range(args.warmup):
            for name, base in BASES.items():
                trace(os.path.join(root, f"warmup-{i}-{name}"), target_config(base, {}),
                      MODELS[args.model], args.steps)
        for i in range(args.repeat):
            one_repeat(root, i, MODELS[args.model], args.steps, found)
            loads.append(os.getloadavg()[0])
        print(table(found, args.repeat, (before, loads)))
        if found.get("memory"):
            print(memory_table(found["memory"]))
        if not args.keep:
            subprocess.run(["rm", "-rf", root], check=False)
    if args.detail:
        print(detail(found))
    print(f"{time.monotonic() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
