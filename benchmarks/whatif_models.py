"""Benchmark: trace-whatif's step time on models written as their communities write them.

    python benchmarks/whatif_models.py [--repeat 3] [--steps 7] [--models llama,gpt2,cnn]
                                       [--targets PREFIX[,...]] [--keep DIR] [--detail]
    python benchmarks/whatif_models.py --reuse DIR [--detail]   # predict again from kept runs
    python benchmarks/whatif_models.py --models llama,cnn --targets pp   # the pipelines only

Each repeat records, per model (tests/scripts/whatif_models.py: a torchtitan-style Llama,
transformers' GPT-2 from a GPT2Config, a CNN in stages; the Llama and the CNN also in a
pipeline of 2 ranks, torch.distributed.pipelining), its DDP configuration with trace-run
(tests/scripts/whatif_train.py, 2 gloo ranks on the CPU, OMP_NUM_THREADS=1, steps 2.. recorded
and counted, with memory: sharding and checkpointing targets are memory questions, refused on a
recording without it), runs every target configuration for real, traced the same way,
predicts each target from the DDP recording (trace-whatif's rules for any model,
docs/whatif.md) and prints the step error (predicted / real - 1 of the slowest
rank's mean counted step, viz.whatif.replay.measures): the median over repeats per target, and the
worst repeat. Goal: the median within 10 % on every target, the worst within 20 %. The runs
of a repeat alternate, so every configuration sees the same machine; the load average before
and during the runs is printed: the numbers hold only on a quiet machine. A second table sets
the pipelines beside their real runs as ratios predicted / real: the step, each rank's peak
memory, each rank's P2P bytes of a step, each the median and the worst. A pipeline's real
run is recorded from its first step (the receive buffers torch.distributed.pipelining makes
there are kept, and a recording begun later would not see them).
"""
from __future__ import annotations

import argparse
import datetime
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "tests"))     # the tests' reading of a real run

from support.whatif_models import predicted_rows, real_step  # noqa: E402
from viz.analysis import analyse  # noqa: E402
from viz.engine import Engine  # noqa: E402
from viz.run import open_run  # noqa: E402
from viz.whatif import what_if  # noqa: E402
from viz.whatif.replay.measures import measures  # noqa: E402
from viz.whatif_cli import step_details  # noqa: E402

TRAIN = os.path.join(REPO, "tests", "scripts", "whatif_train.py")
CHECKPOINTED = {"llama": "layers.*", "gpt2": "transformer.h.*", "cnn": "stages.*"}
# where a pipeline's stages begin: 2 stages, and 4 (2 a rank, interleaved)
SPLIT = {"llama": "layers.2", "cnn": "stages.1"}
INTERLEAVED = {"llama": "layers.1,layers.2,layers.3", "cnn": "stages.0,stages.1,stages.2"}
MODEL_VALUES = {"CKPT": CHECKPOINTED, "SPLIT": SPLIT, "INTERLEAVED": INTERLEAVED}


def _pipeline(name: str, split: str, schedule: str) -> tuple:
    changes = {"pp": 2, "split": split, "schedule": schedule, "microbatches": 4}
    return (name, changes, ["--pp", "2", "--split", split, "--schedule", schedule,
                            "--microbatches", "4"], 2)


# (name, trace-whatif's changes, whatif_train.py's arguments, ranks); the values MODEL_VALUES
# names are the model's
TARGETS = [("ZeRO-1", {"shard": "optimizer"}, ["--shard", "optimizer"], 2),
           ("ZeRO-2", {"shard": "gradients"}, ["--shard", "gradients"], 2),
           ("FSDP2", {"shard": "full"}, ["--shard", "full"], 2),
           ("checkpointing", {"checkpoint": "CKPT"}, ["--checkpoint", "CKPT"], 2),
           ("grad-accum 2", {"grad_accum": 2}, ["--grad-accum", "2"], 2),
           ("micro-batch 8", {"microbatch_size": 8}, ["--microbatch-size", "8"], 2),
           ("dp 1", {"dp": 1}, [], 1),
           _pipeline("pp 2 1F1B m4", "SPLIT", "1f1b"),
           _pipeline("pp 2 GPipe m4", "SPLIT", "gpipe"),
           _pipeline("pp 2 interl. m4", "INTERLEAVED", "interleaved")]
MEDIAN_GOAL, WORST_GOAL = 0.10, 0.20
P2P = ("send", "recv")


def targets_of(model: str) -> list:
    """The targets a model runs (a pipeline where it has a split), its values filled in."""
    out = []
    for name, changes, args, ranks in TARGETS:
        values = list(changes.values()) + args
        if any(v in MODEL_VALUES and model not in MODEL_VALUES[v] for v in values):
            continue
        out.append((name, {k: resolved(model, [v])[0] for k, v in changes.items()},
                    resolved(model, args), ranks))
    return out


def resolved(model: str, values: list) -> list:
    """A target's changes or arguments with the model's own values filled in."""
    return [MODEL_VALUES[v][model] if isinstance(v, str) and v in MODEL_VALUES else v
            for v in values]


def trace(out: str, model: str, args: list, ranks: int, steps: int) -> str:
    """trace-run of whatif_train.py into ``out``: steps 2.., but a pipeline's from its first
    step (torch.distributed.pipelining makes its receive buffers there and keeps them: a
    recording begun later does not see them; its step 0 is not counted all the same)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="", PYTHONPATH=REPO)
    recorded = [] if "--pp" in args else ["--steps", "2-"]
    proc = subprocess.run(
        [sys.executable, "-m", "instrument.launch", "--nproc-per-node", str(ranks), "--out",
         out, *recorded, "--no-report", "--memory", TRAIN, "--model", model,
         "--steps", str(steps), *args], env=env, cwd=REPO, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"trace-run failed for {model} {args}: {proc.stderr[-2000:]}")
    return out


def chosen(name: str, prefixes: list) -> bool:
    """Whether a target is one --targets names (every target without it)."""
    return not prefixes or any(name.startswith(p) for p in prefixes)


def one_repeat(root: str, i: int, models: list, steps: int, found: dict,
               prefixes: list) -> None:
    """Record each model's DDP base and every chosen target for real, alternating."""
    for model in models:
        runs = {"DDP": trace(os.path.join(root, f"{i}-{model}-base"), model, [], 2, steps)}
        for n, (name, _, args, ranks) in enumerate(targets_of(model)):
            if chosen(name, prefixes):
                runs[name] = trace(os.path.join(root, f"{i}-{model}-{n}"), model, args,
                                   ranks, steps)
        evaluate(model, runs, found)


def evaluate(model: str, runs: dict, found: dict) -> None:
    """Predict every target from the DDP run; pair each prediction with its real run's
    measures (``runs``: name -> run directory)."""
    base = analyse(open_run(runs["DDP"]))
    with Engine(1) as engine:
        details = step_details(base, engine)
    targets = [t for t in targets_of(model) if t[0] in runs]
    result = what_if(base, [t[1] for t in targets], details, runs["DDP"])
    found.setdefault((model, "replayed"), []).append(
        (dict(result.replayed, memory=result.memory_replayed, comm=None),
         dict(result.measured, memory=real_peaks(base), comm=None)))
    for (name, *_), prediction in zip(targets, result.targets):
        real = analyse(open_run(runs[name]))
        last = real_step(pathlib.Path(runs[name]))
        found.setdefault((model, name), []).append(
            (dict(prediction.measures, memory=prediction.memory,
                  comm=same_comm(prediction.collectives, last),
                  p2p={r: p2p_bytes(predicted_rows(rows))
                       for r, rows in prediction.collectives.items()}),
             dict(measures(real.metrics), memory=real_peaks(real),
                  p2p={r: p2p_bytes(mine["comm"]) for r, mine in last.items()})))


def real_peaks(analysis) -> dict:
    """rank -> its peak (viz.analysis.memory), of a run recorded with memory."""
    return {str(r): mine.memory.peak_bytes for r, mine in analysis.ranks.items()
            if mine.memory is not None}


def same_comm(predicted: dict, real: dict) -> bool:
    """Whether a prediction's communications of a step are the real run's in its last
    counted step (kind, phase, group, dimension, count, bytes), on every rank."""
    return sorted(predicted) == sorted(real) and all(
        predicted_rows(predicted[rank]) == mine["comm"] for rank, mine in real.items())


def p2p_bytes(rows: list) -> int:
    """The bytes a rank sent and received in a step, of rows as real_step gives them."""
    return sum(row[-1] for row in rows if row[0] in P2P)


def reused(root: str) -> list:
    """(model, runs) of every repeat a --keep directory holds."""
    out: dict = {}
    for name in sorted(os.listdir(root)):
        i, model, which = (name.split("-", 2) + ["", ""])[:3]
        if not i.isdigit():
            continue
        label = "DDP" if which == "base" else targets_of(model)[int(which)][0]
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


def pipeline_table(found: dict) -> str:
    """The pipeline targets side by side with their real runs, as ratios predicted / real:
    the step (one a repeat), each rank's peak memory and each rank's P2P bytes a step (one a
    rank and repeat); the median and the worst (farthest from 1) of each."""
    lines = ["pipelines, predicted / real: median and worst (farthest from 1) over repeats "
             "(step) and over ranks and repeats (peak memory, P2P bytes)",
             f"{'model':<7}{'target':<17}{'step med':>9}{'worst':>8}{'peak med':>10}"
             f"{'worst':>8}{'P2P med':>9}{'worst':>8}"]
    for (model, name), pairs in found.items():
        if not name.startswith("pp"):
            continue
        steps = [p["step_s"] / r["step_s"] for p, r in pairs]
        peaks = [p["memory"][k]["peak_bytes"] / b for p, r in pairs
                 for k, b in r["memory"].items()]
        p2p = [p["p2p"][k] / b for p, r in pairs for k, b in r["p2p"].items() if b]
        cells = "".join(f"{statistics.median(v):{w}.4f}{max(v, key=lambda x: abs(x - 1)):8.4f}"
                        for v, w in ((steps, 9), (peaks, 10), (p2p, 9)))
        lines.append(f"{model:<7}{name:<17}{cells}")
    return "\n".join(lines)


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
    parser.add_argument("--targets", default="", metavar="PREFIX[,...]",
                        help="only the targets whose names begin so ('pp' for the pipelines)")
    args = parser.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    prefixes = [p for p in args.targets.split(",") if p]
    if prefixes and not any(chosen(t[0], prefixes) for m in models for t in targets_of(m)):
        parser.error(f"--targets: {args.targets} names no target of {args.models}")
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
        print(table(found, len({runs["DDP"].rsplit("-", 2)[0] for _, runs in kept}), None))
        print(pipeline_table(found))
    else:
        root = args.keep or tempfile.mkdtemp(prefix="whatif-models-")
        os.makedirs(root, exist_ok=True)
        before, loads = os.getloadavg()[0], []
        for i in range(args.repeat):
            one_repeat(root, i, models, args.steps, found, prefixes)
            loads.append(os.getloadavg()[0])
        print(table(found, args.repeat, (before, loads)))
        print(pipeline_table(found))
        if not args.keep:
            subprocess.run(["rm", "-rf", root], check=False)
    if args.detail:
        print(detail(found))
    print(f"{time.monotonic() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
