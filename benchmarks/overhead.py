"""Recorder overhead, side by side in one run, on the reference GPT (one process, CPU or GPU).

For a tiny-op and a mid-op model (4 transformer blocks, AdamW) prints the median step time of
each recorder and its extra time over the untraced step, in wall time, the main thread's CPU
time and the process's CPU time, then each recorder's worst step beside its median step, and
where it fell (round and counted step: a one-time cost falls in the same place in every run):

- untraced;
- a bare no-op TorchDispatchMode whose ``__torch_dispatch__`` only calls the op (the floor any
  dispatch-mode recorder pays; the floor of the targets);
- the same without the Dynamo-disable wrapper torch puts around it by default, which paratrace
  also leaves out: the lower floor, against which paratrace's ratio is the less flattering one;
- paratrace with stacks, shapes and modules on;
- the same with the Python twins of its C hot path (tracer/recorder/csrc/hotpath/), where that
  is built: what the extension buys;
- paratrace outside its recorded steps (``steps="0"``: only the warm-up step is recorded, the
  timed steps are not), against untraced: what a ``--steps`` window costs the other steps;
- torch.profiler(with_stack=True, record_shapes=True);
- paratrace recording memory too (``memory=True``: tracer/recorder/memory/memory_recorder.py),
  beside torch.profiler(profile_memory=True), the memory tool users compare it with;
- optionally DebugMode(record_stack_trace=True) (``--debug-mode``: slow).

Then paratrace's bytes per event on disk and the reader's events per second on a
>= 1,000,000-event trace.

    python benchmarks/overhead.py [--rounds 7] [--steps 6] [--models tiny,mid] [--debug-mode]
    python benchmarks/overhead.py --hot-loop mid --seconds 20     # for py-spy / cProfile
    python benchmarks/overhead.py --device cuda --models small,large    # on a GPU

Targets (docs/overhead.md): paratrace's extra time <= 2x the no-op mode's (stretch 1.5x) and <= the
profiler's; with memory, <= 2x the no-op mode's (stretch 1.5x) and <= profile_memory's; an
unrecorded step costs what an untraced one does; <= 48 bytes/event; the reader loads
>= 1,000,000 events/s. The machine is noisy: every round runs every recorder on every model
in turn, so load drifts hit all of them alike, and medians over rounds are reported.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import overhead_recorders  # noqa: E402
import tracer  # noqa: E402
from overhead_recorders import (MEMORY, MODELS, PROFILE_MEMORY, UNWRAPPED,  # noqa: E402
                                Recorders, ops_per_step, step_times)
from tracer.files.format import TraceWriter  # noqa: E402


def measure(recorders: Recorders, models: list, rounds: int, steps: int) -> tuple:
    """(times, steps_seen). times: (model, recorder) -> per round: (wall, main thread's CPU,
    process CPU) seconds a step, the finishing work included (spread over the run's steps).
    Process CPU is a mean, not a median: the flusher's work lands in some steps and not
    others. steps_seen: (model, recorder) -> every counted step's (wall, main thread's CPU)
    seconds, round (from 1) and step (from 1, the counted ones), over all rounds: its worst
    steps (a GPU window's close lands in one step), and where they fell."""
    times = {(m, name): [] for m in models for name in recorders.factories}
    seen = {(m, name): [] for m in models for name in recorders.factories}
    for round_ in range(rounds + 1):               # round 0 warms every path up, not counted
        for model in models:
            recorders.model = model
            for name, factory in recorders.factories.items():
                walls, cpus, finish_wall, finish_cpu, mains, finish_main = step_times(
                    model, steps if round_ else 3, factory)
                if round_:
                    times[model, name].append(
                        (statistics.median(walls) + finish_wall / steps,
                         statistics.median(mains) + finish_main / steps,
                         statistics.mean(cpus) + finish_cpu / steps))
                    seen[model, name].extend((wall, main, round_, k) for k, (wall, main)
                                             in enumerate(zip(walls, mains), start=1))
    return times, seen


def report(times: dict, seen: dict, recorders: Recorders, models: list) -> None:
    """Extra time: over the untraced step, of the in-run step time plus the recorder's
    finishing work per step (paratrace: the last flush; torch.profiler: processing its events
    at exit and writing its file), medians over rounds of each round's median step. Three
    clocks: wall; the main thread's CPU time, which neither other processes on the machine nor
    the recorder's own threads disturb (what the recorder costs the training thread); and the
    process's CPU time, every thread (what it costs the machine)."""
    clocks = ("wall", "main", "cpu")
    for model in models:
        per_op = ops_per_step(tracer.load(recorders.last_trace[model]))
        base = [statistics.median(t[i] for t in times[model, "untraced"]) for i in range(3)]
        print(f"\n{model}: reference GPT, one process on {overhead_recorders.DEVICE}, "
              f"{' '.join(MODELS[model])}; "
              f"{per_op} recorded ops a step")
        print(f"{'recorder':28s}" + "".join(f" {c + ' step':>10s} {'extra':>6s} {'extra/op':>9s}"
                                            for c in ("wall", "main cpu", "all cpu")))
        extra = {}
        for (m, name), samples in times.items():
            if m != model:
                continue
            step = [statistics.median(t[i] for t in samples) for i in range(3)]
            extra[name] = [step[i] / base[i] - 1 for i in range(3)]
            print(f"{name:28s}" + "".join(
                f" {step[i] * 1e3:8.2f}ms {extra[name][i]:6.2f} "
                f"{(step[i] - base[i]) / per_op * 1e6:7.2f}us" for i in range(3)))
        for i, clock in enumerate(clocks):
            floor, para = extra["no-op dispatch mode"][i], extra["paratrace"][i]
            prof, off = extra["torch.profiler"][i], extra["paratrace, unrecorded step"][i]
            memory, profile_memory = extra[MEMORY][i], extra[PROFILE_MEMORY][i]
            print(f"{clock:4s}: paratrace extra / no-op mode extra {para / floor:5.2f} (target "
                  f"<= 2, stretch 1.5); / profiler extra {para / prof:5.2f} (target <= 1); "
                  f"unrecorded / untraced step {1 + off:5.3f} (target 1)")
            print(f"{clock:4s}: paratrace with memory: extra / no-op mode extra "
                  f"{memory / floor:5.2f} (target <= 2, stretch 1.5); / profile_memory extra "
                  f"{memory / profile_memory:5.2f} (target <= 1)")
        low = [extra["paratrace"][i] / extra[UNWRAPPED][i] for i in range(3)]
        print(f"paratrace extra / extra of the no-op mode without torch's Dynamo wrapper: "
              f"wall {low[0]:.2f}, main {low[1]:.2f}, cpu {low[2]:.2f}")
        print(paired_line(times, model, clocks))
        print(paired_line(times, model, clocks, MEMORY))
        print(paired_line(times, model, clocks, MEMORY, PROFILE_MEMORY))
        print(worst_lines(seen, model))


def worst_lines(seen: dict, model: str) -> str:
    """Each recorder's worst step beside its median step, over every counted step of every
    round (no finishing work): a stall that lands in one step in a few (a GPU window's close,
    a flush) shows here and hides in the medians above. ``at``: the round and counted step of
    the worst wall step (a one-time cost lands in the same place every run; a stall anywhere)."""
    lines = [f"worst step of each recorder, over every counted step ({model}):",
             f"{'recorder':28s} {'wall median':>11s} {'worst':>9s} {'x median':>8s}"
             f" {'main cpu median':>15s} {'worst':>9s} {'x median':>8s} {'at':>11s}"]
    for (m, name), steps in seen.items():
        if m != model or not steps:
            continue
        parts = []
        for i, width in ((0, 11), (1, 15)):
            values = [s[i] for s in steps]
            median, worst = statistics.median(values), max(values)
            parts.append(f"{median * 1e3:{width - 2}.2f}ms {worst * 1e3:7.2f}ms "
                         f"{worst / median if median > 0 else float('nan'):8.2f}")
        at = max(steps, key=lambda s: s[0])
        lines.append(f"{name:28s} {parts[0]} {parts[1]} {f'r{at[2]} step {at[3]}':>11s}")
    return "\n".join(lines)


def paired_line(times: dict, model: str, clocks: tuple, name: str = "paratrace",
                against: str = "no-op dispatch mode") -> str:
    """Recorder ``name``'s extra over ``against``'s (the floor) within each round (they run
    back to back, so a drift of the machine between rounds cancels): median and quartiles over
    rounds, per clock. On a model whose floor adds a fifth to the step, a 2 % wobble of one
    step moves that ratio by a tenth, which the ratio of medians above hides."""
    parts = []
    for i, clock in enumerate(clocks):
        ratios = sorted(
            (para[i] - base[i]) / (floor[i] - base[i])
            for base, floor, para in zip(times[model, "untraced"], times[model, against],
                                         times[model, name])
            if floor[i] > base[i])
        if not ratios:
            parts.append(f"{clock} -")
            continue
        q1, q3 = np.percentile(ratios, [25, 75])
        parts.append(f"{clock} {statistics.median(ratios):.2f} [{q1:.2f}, {q3:.2f}]")
    rounds = len(times[model, "untraced"])
    floor = "no-op mode" if against == "no-op dispatch mode" else against
    return (f"per round: {name} extra / {floor} extra, median [quartiles] of {rounds} "
            f"rounds: {', '.join(parts)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--models", default="tiny,mid",
                        help=f"comma-separated, of {', '.join(MODELS)} (default tiny,mid; on "
                        "a GPU the targets name: small,large)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where the model runs (cuda: the first GPU; steps are timed "
                        "with torch.cuda.synchronize)")
    parser.add_argument("--reader-events", type=int, default=1_000_000)
    parser.add_argument("--debug-mode", action="store_true")
    parser.add_argument("--hot-loop", metavar="MODEL",
                        help="only run paratrace on MODEL for --seconds (to profile it)")
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--instructions", action="store_true",
                        help="count instructions per op under valgrind (deterministic; slow)")
    parser.add_argument("--one-run", nargs=3, metavar=("RECORDER", "MODEL", "STEPS"),
                        help=argparse.SUPPRESS)
    parser.add_argument("--handshake", help=argparse.SUPPRESS)
    args = parser.parse_args()
    unknown = [m for m in args.models.split(",") if m not in MODELS]
    if unknown:
        parser.error(f"--models: no model named {', '.join(unknown)} (choose from "
                     f"{', '.join(MODELS)})")
    if args.device == "cuda" and args.instructions:
        parser.error("--instructions counts CPU instructions under valgrind: --device cpu only")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA GPU on this machine")
    overhead_recorders.DEVICE = torch.device(args.device)
    torch.set_num_threads(1)
    tmp = tempfile.mkdtemp(prefix="paratrace-bench-")
    # NOTE: under callgrind a step takes about 50 times as long, so the flusher's four
    # wake-ups a second would come 50 times as often a step, and as many as the machine's load
    # allows: the counted run flushes at step ends only, so its count is repeatable
    recorders = Recorders(tmp, args.debug_mode, 1000.0 if args.handshake else 0.25)
    try:
        if args.hot_loop:
            hot_loop(recorders, args.hot_loop, args.seconds)
        elif args.one_run:
            from overhead_callgrind import handshake
            name, model, steps = args.one_run
            recorders.model = model
            factories = {**recorders.factories, **recorders.ablations}
            # NOTE: two warm-up steps: the flusher's first flush, after the first step, imports
            # what writing needs; it must not fall into the counted steps by chance
            hook, done = handshake(args.handshake, 2) if args.handshake else (None, None)
            step_times(model, int(steps), factories[name], hook)
            if done:
                done()
        elif args.instructions:
            from overhead_callgrind import instructions
            instructions(recorders, args.models.split(","))
        else:
            run(recorders, args)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def run(recorders: Recorders, args) -> None:
    models = args.models.split(",")
    load = os.getloadavg()
    times, seen = measure(recorders, models, args.rounds, args.steps)
    print(f"{args.rounds} interleaved rounds of {args.steps} steps (first dropped), medians; "
          f"load average at start {load[0]:.2f}, at end {os.getloadavg()[0]:.2f}, "
          f"{os.cpu_count()} CPUs")
    report(times, seen, recorders, models)

    trace_path = recorders.last_trace[models[-1]]
    trace = tracer.load(trace_path)
    size = os.path.getsize(trace_path)
    print(f"\nbytes per event on disk: {size / len(trace):.1f} ({len(trace)} events, {size} "
          f"bytes; target <= 48)")
    rate, n = reader_rate(trace, args.reader_events, recorders.tmp)
    print(f"reader: {rate:,.0f} events/s on a {n:,}-event trace (target >= 1,000,000)")


def hot_loop(recorders: Recorders, model: str, seconds: float) -> None:
    """Run paratrace on one model until `seconds` pass: a steady target for a profiler."""
    recorders.model = model
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        step_times(model, 6, recorders.paratrace)


def reader_rate(trace, want: int, tmp: str):
    """Write a >= `want`-event trace by repeating a real recording's rows, time tracer.load."""
    table = trace.table
    dict_cols = [pa_is_dict(table.column(n).type) for n in table.column_names]
    cols = [[None if v < 0 else v for v in trace.col(name).tolist()] if is_dict
            else table.column(name).to_pylist()
            for name, is_dict in zip(table.column_names, dict_cols)]
    rows = list(zip(*cols))
    dictionaries = {name: trace.dictionary(name)
                    for name, is_dict in zip(table.column_names, dict_cols) if is_dict}
    path = os.path.join(tmp, "big.arrow")
    writer = TraceWriter(path, dict(trace.meta))
    while writer.events < want:
        writer.write(rows, dictionaries)
    writer.close()
    best = None
    for _ in range(3):
        start = time.perf_counter()
        loaded = tracer.load(path)
        for name in ("op", "t0", "t1", "stack", "phase"):
            loaded.col(name)
        elapsed = time.perf_counter() - start
        best = elapsed if best is None else min(best, elapsed)
    return len(loaded) / best, len(loaded)


def pa_is_dict(typ) -> bool:
    return hasattr(typ, "index_type")


if __name__ == "__main__":
    main()
