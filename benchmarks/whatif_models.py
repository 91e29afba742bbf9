"""Benchmark: trace-whatif's step time on models written as their communities write them.

    python benchmarks/whatif_models.py [--repeat 3] [--steps 7] [--models llama,gpt2,cnn]
                                       [--keep DIR] [--detail]
    python benchmarks/whatif_models.py --reuse DIR [--detail]   # predict again from kept runs

Each repeat records, per model (tests/scripts/whatif_models.py: a torchtitan-style Llama,
transformers' GPT-2 from a GPT2Config, a CNN in stages), its DDP configuration with trace-run
(tests/scripts/whatif_train.py, 2 gloo ranks on the CPU, OMP_NUM_THREADS=1, steps 2.. recorded
and counted, with memory: sharding and checkpointing targets are memory questions, refused on a
recording without it), runs every target configuration for real, traced the same way, predicts each target from the DDP recording (trace-whatif's rules
for any model, docs/whatif.md) and prints the step error (predicted / real - 1 of the slowest
rank's mean counted step, viz.whatif.measures): the median over repeats per target, and the
worst repeat. Goal: the median within 10 % on every target, the worst within 20 %. The runs
of a repeat alternate, so every configuration sees the same machine; the load average before
and during the runs is printed: the numbers hold only on a quiet machine.
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
from viz.engine import Engine  # noqa: E402
from viz.run import open_run  # noqa: E402
from viz.whatif import what_if  # noqa: E402
from viz.whatif.measures import measures  # noqa: E402
from viz.whatif_cli import step_details  # noqa: E402

TRAIN = os.path.join(REPO, "tests", "scripts", "whatif_train.py")
CHECKPOINTED = {"llama": "layers.*", "gpt2": "transformer.h.*", "cnn": "stages.*"}
# (name, trace-whatif's changes, whatif_train.py's arguments, ranks)
TARGETS = [("ZeRO-1", {"shard": "optimizer"}, ["--shard", "optimizer"], 2),
           ("ZeRO-2", {"shard": "gradients"}, ["--shard", "gradients"], 2),
           ("FSDP2", {"shard": "full"}, ["--shard", "full"], 2),
           ("checkpointing", {"checkpoint": None}, ["--checkpoint", None], 2),
           ("grad-accum 2", {"grad_accum": 2}, ["--grad-accum", "2"], 2),
           ("micro-batch 8", {"microbatch_size": 8}, ["--microbatch-size", "8"], 2),
           ("dp 1", {"dp": 1}, [], 1)]
MEDIAN_GOAL, WORST_GOAL = 0.10, 0.20


def resolved(model: str, values: list) -> list:
    """A target's changes or arguments with the model's checkpointed modules filled in."""
    return [CHECKPOINTED[model] if v is None else v for v in values]


def trace(out: str, model: str, args: list, ranks: int, steps: int) -> str:
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", PYTHONPATH=REPO)
    proc = subprocess.run(
        [sys.executable, "-m", "instrument.launch", "--nproc-per-node", str(ranks), "--out",
         out, "--steps", "2-", "--no-report", "--memory", TRAIN, "--model", model, "--steps", str(steps),
         *args], env=env, cwd=REPO, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"trace-run failed for {model} {args}: {proc.stderr[-2000:]}")
    return out


def one_repeat(root: str, i: int, models: list, steps: int, found: dict) -> None:
    """Record each model's DDP base and every target for real, alternating."""
    for model in models:
        runs = {"DDP": trace(os.path.join(root, f"{i}-{model}-base"), model, [], 2, steps)}
        for n, (name, _, args, ranks) in enumerate(TARGETS):
            runs[name] = trace(os.path.join(root, f"{i}-{model}-{n}"), model,
                               resolved(model, args), ranks, steps)
        evaluate(model, runs, found)


def evaluate(model: str, runs: dict, found: dict) -> None:
    """Predict every target from the DDP run; pair each prediction with its real run's
    measures (``runs``: name -> run directory)."""
    base = analyse(open_run(runs["DDP"]))
    with Engine(1) as engine:
        details = step_details(base, engine)
    changes = [{k: resolved(model, [v])[0] for k, v in t[1].items()} for t in TARGETS]
    result = what_if(base, changes, details, runs["DDP"])
    found.setdefault((model, "replayed"), []).append(
        (dict(result.replayed, memory=result.memory_replayed, comm=None),
         dict(result.measured, memory=real_peaks(base), comm=None)))
    for (name, *_), prediction in zip(TARGETS, result.targets):
        real = analyse(open_run(runs[name]))
        found.setdefault((model, name), []).append(
            (dict(prediction.measures, memory=prediction.memory,
                  comm=same_comm(prediction.collectives, real)),
             dict(measures(real.metrics), memory=real_peaks(real))))


def real_peaks(analysis) -> dict:
    """rank -> its peak (viz.analysis.memory), of a run recorded with memory."""
    return {str(r): mine.memory.peak_bytes for r, mine in analysis.ranks.items()
            if mine.memory is not None}


def same_comm(predicted: dict, real) -> bool:
    """Whether a prediction's communications of a step, times the recorded steps, are the
    real run's over them (kind, phase, group, count, bytes; every recorded step alike)."""
    for rank, mine in real.ranks.items():
        steps = len(mine.counted_steps)
        got = sorted((r["kind"], r["phase"], tuple(r["group"]), r["count"] * steps,
                      r["bytes"] * steps) for r in predicted[str(rank)])
        want = sorted((c.kind, c.phase, tuple(c.group), c.count, c.bytes) for c in mine.comm
                      if c.phase != "other" or c.kind not in ("send", "recv"))
        if got != want:
            return False
    return True


def reused(root: str) -> list:
    """(model, runs) of every repeat a --keep directory holds."""
    out: dict = {}
    for name in sorted(os.listdir(root)):
        i, model, which = (name.split("-", 2) + ["", ""])[:3]
        if not i.isdigit():
            continue
        label = "DDP" if which == "base" else TARGETS[int(which)][0]
        out.setdefault((int(i), model), {})[label] = os.path.join(root, name)
    return [(model, runs) for (_, model), runs in sorted(out.items())]


def table(found: dict, repeats: int, loads) -> str:
    """Per model and target: the medians over repeats of the predicted and real step, the
    median and the worst step error, and whether the goals hold."""
    where = "reused runs" if loads is None else (
        f"load average {loads[0]:.2f} before, {statistics.median(loads[1]):.1f} while running, "
        f"{os.cpu_count()} cores")
    lines = [f"trace-whatif on any model against real runs, {datetime.date.today()}, "
             f"{repeats} repeat(s), 2 ranks ({where})",
             f"{'model':<7}{'target':<15}{'pred step':>10}{'real step':>10}{'median err':>11}"
             f"{'worst err':>10}  goals met  {'peak err':>8}  same comm"]
    for (model, name), pairs in found.items():
        errors = [p["step_s"] / r["step_s"] - 1 for p, r in pairs]
        middle, worst = statistics.median(errors), max(errors, key=abs)
        goal = MEDIAN_GOAL if name != "replayed" else 0.03
        ok = "yes" if abs(middle) <= goal and abs(worst) <= max(WORST_GOAL, goal) else "NO"
        peak = _peak_error(pairs)
        comm = {True: "yes", False: "NO", None: ""}[_all([p.get("comm") for p, _ in pairs])]
        lines.append(f"{model:<7}{name:<15}"
                     f"{1e3 * statistics.median(p['step_s'] for p, _ in pairs):9.1f}m"
                     f"{1e3 * statistics.median(r['step_s'] for _, r in pairs):9.1f}m"
                     f"{100 * middle:+10.1f}%{100 * worst:+9.1f}%  {ok:<9}"
                     f"{'' if peak is None else f'{100 * peak:+8.2f}%':>10}  {comm}")
    return "\n".join(lines)


def _peak_error(pairs: list):
    """The worst rank's peak memory error over the repeats, or None without memory."""
    errors = [p["memory"][r]["peak_bytes"] / b - 1 for p, real in pairs
              if p.get("memory") and real.get("memory")
              for r, b in real["memory"].items() if r in p["memory"]]
    return max(errors, key=abs) if errors else None


def _all(values: list):
    """True or False where every value says so, None where none was checked."""
    checked = [v for v in values if v is not None]
    return None if not checked else all(checked)


def detail(found: dict) -> str:
    lines = ["per repeat: step error %"]
    for (model, name), pairs in found.items():
        lines.append(f"{model:<7}{name:<15}" + "  ".join(
            f"{100 * (p['step_s'] / r['step_s'] - 1):+6.1f}" for p, r in pairs))
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="repeats (default 3)")
    parser.add_argument("--steps", type=int, default=7,
                        help="steps per run; steps 2.. are recorded and counted (default 7)")
    parser.add_argument("--models", default="llama,gpt2,cnn", help="comma-separated")
    parser.add_argument("--keep", metavar="DIR", help="keep the runs in DIR")
    parser.add_argument("--reuse", metavar="DIR", help="predict again from a --keep DIR")
    parser.add_argument("--detail", action="store_true", help="every repeat's errors too")
    args = parser.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    unknown = [m for m in models if m not in CHECKPOINTED]
    if unknown:
        parser.error(f"--models: unknown {', '.join(unknown)} (llama, gpt2, cnn)")
    found: dict = {}
    start = time.monotonic()
    if args.reuse:
        kept = [(m, runs) for m, runs in reused(args.reuse) if m in models]
        if not kept:
            raise SystemExit(f"{args.reuse}: no runs of benchmarks/whatif_models.py --keep")
        for model, runs in kept:
            evaluate(model, runs, found)
        print(table(found, len(kept) // max(len(models), 1), None))
    else:
        root = args.keep or tempfile.mkdtemp(prefix="whatif-models-")
        os.makedirs(root, exist_ok=True)
        before, loads = os.getloadavg()[0], []
        for i in range(args.repeat):
            one_repeat(root, i, models, args.steps, found)
            loads.append(os.getloadavg()[0])
        print(table(found, args.repeat, (before, loads)))
        if not args.keep:
            subprocess.run(["rm", "-rf", root], check=False)
    if args.detail:
        print(detail(found))
    print(f"{time.monotonic() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
