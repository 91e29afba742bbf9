"""Recorder overhead, side by side in one run, on the reference GPT (one process, CPU or GPU).

For a tiny-op and a mid-op model (4 transformer blocks, AdamW) prints the median step time of
each recorder and its extra time over the untraced step, in wall time, the main thread's CPU
time and the process's CPU time:

- untraced;
- a bare no-op TorchDispatchMode whose ``__torch_dispatch__`` only calls the op (the floor any
  dispatch-mode recorder pays; the issue's floor);
- the same without the Dynamo-disable wrapper torch puts around it by default, which paratrace
  also leaves out: the lower floor, against which paratrace's ratio is the less flattering one;
- paratrace with stacks, shapes and modules on;
- the same with the Python twins of its C hot path (tracer/csrc/), where that is built:
  what the extension buys;
- paratrace outside its recorded steps (``steps="0"``: only the warm-up step is recorded, the
  timed steps are not), against untraced: what a ``--steps`` window costs the other steps;
- torch.profiler(with_stack=True, record_shapes=True);
- optionally DebugMode(record_stack_trace=True) (``--debug-mode``: slow).

Then paratrace's bytes per event on disk and the reader's events per second on a
>= 1,000,000-event trace.

    python benchmarks/overhead.py [--rounds 7] [--steps 6] [--models tiny,mid] [--debug-mode]
    python benchmarks/overhead.py --hot-loop mid --seconds 20     # for py-spy / cProfile
    python benchmarks/overhead.py --device cuda --models small,large    # on a GPU

Targets (issue 15): paratrace's extra time <= 2x the no-op mode's (stretch 1.5x) and <= the
profiler's; an unrecorded step costs what an untraced one does; <= 48 bytes/event; the reader
loads >= 1,000,000 events/s. The machine is noisy: every round runs every recorder on every model
in turn, so load drifts hit all of them alike, and medians over rounds are reported.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import tracer  # noqa: E402
import tracer.session  # noqa: E402
from sample_runs.config import parse_config  # noqa: E402
from sample_runs.parallel.process_groups import single_process_groups  # noqa: E402
from sample_runs.train import train  # noqa: E402
from tracer.format import TraceWriter  # noqa: E402
from tracer.ops import PSEUDO_OPS  # noqa: E402
from tracer.shapes import PyShapeSignatures  # noqa: E402
from tracer.stacks import PyStackInterner, StackInterner  # noqa: E402

_COMMON = ["--tp", "1", "--pp", "1", "--no-sp", "--layers", "4", "--heads", "4",
           "--micro-batch-size", "2", "--microbatches", "2"]
MODELS = {
    "tiny": _COMMON + ["--hidden", "32", "--seq-len", "16"],     # ops of a few microseconds
    "mid": _COMMON + ["--hidden", "192", "--seq-len", "64"],     # ops of tens of microseconds
    # issue 15's GPU models (--device cuda): the small reference GPT of its H100 numbers and of
    # ../shared/fixtures/gpu-h100, and the hidden-1024 one of docs/gpu.md
    "small": ["--tp", "1", "--pp", "1", "--no-sp", "--layers", "4", "--heads", "4",
              "--hidden", "256", "--seq-len", "256", "--micro-batch-size", "4",
              "--microbatches", "2"],
    "large": ["--tp", "1", "--pp", "1", "--no-sp", "--layers", "8", "--heads", "16",
              "--hidden", "1024", "--seq-len", "1024", "--micro-batch-size", "4",
              "--microbatches", "2"],
}
DEVICE = torch.device("cpu")     # --device; on CUDA every step stamp waits for the GPU
UNWRAPPED = "no-op mode, no Dynamo wrapper"


class NoopMode(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class UnwrappedNoopMode(TorchDispatchMode):
    """The no-op mode without the torch._dynamo.disable wrapper that torch (2.13: for every
    mode whose _should_skip_dynamo() is True, the default) puts around __torch_dispatch__;
    paratrace leaves it out too (tracer/_mode.py), so this is the floor its own design pays."""
    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def step_times(model: str, steps: int, recorder, on_step=None) -> tuple:
    """A `steps`-step run under `recorder` (a context factory): per optimizer step, wall and
    CPU seconds (CPU: every thread of the process, the recorder's flusher included), then the
    wall and CPU seconds the recorder took to finish after the last step, then the same two of
    the main thread's CPU seconds (what the training thread itself ran: neither other
    processes taking the core nor the recorder's other threads count). The first step warms
    up and is left out. ``on_step``, if given, runs after each optimizer step."""
    walls, cpus, mains = [], [], []
    sync = torch.cuda.synchronize if DEVICE.type == "cuda" else lambda: None
    def stamp(*a):
        sync()                                # a step ends when its kernels have run
        walls.append(time.perf_counter())
        cpus.append(time.process_time())
        mains.append(time.thread_time())      # the hook runs on the training thread
        if on_step is not None:
            on_step()
    handle = register_optimizer_step_post_hook(stamp)
    cfg = parse_config(MODELS[model] + ["--steps", str(steps)], world_size=1)
    torch.manual_seed(0)
    try:
        with recorder():
            with contextlib.redirect_stdout(open(os.devnull, "w")):
                train(cfg=cfg, groups=single_process_groups(), device=DEVICE)
            sync()
            trained = time.perf_counter(), time.process_time(), time.thread_time()
        finished = time.perf_counter(), time.process_time(), time.thread_time()
    finally:
        handle.remove()
    return (_deltas(walls), _deltas(cpus), finished[0] - trained[0],
            finished[1] - trained[1], _deltas(mains), finished[2] - trained[2])


def _deltas(stamps: list) -> list:
    return [b - a for a, b in zip(stamps, stamps[1:])]


class Recorders:
    """The recorders compared, each a context factory; their output goes to a temp dir."""

    def __init__(self, tmp: str, debug_mode: bool, flush_interval: float = 0.25):
        self.tmp = tmp
        self.flush_interval = flush_interval   # paratrace's (see overhead_callgrind.py)
        self.runs = 0
        self.last_trace: dict = {}          # model -> trace file of its last full recording
        self.model = None
        self.factories = {"untraced": contextlib.nullcontext, "no-op dispatch mode": NoopMode,
                          UNWRAPPED: UnwrappedNoopMode,
                          "paratrace": self.paratrace, "paratrace, unrecorded step":
                          self.paratrace_unrecorded, "torch.profiler": self.profiler}
        if StackInterner.HOT_PATH == "c":      # what the C hot path buys (tracer/csrc/)
            self.factories["paratrace, Python hot path"] = self.paratrace_python
        if debug_mode:
            self.factories["DebugMode"] = self.debug_mode
        # what each part of the recording costs: paratrace with one of them off
        self.ablations = {f"paratrace without {part}": self._without(part)
                          for part in ("stacks", "shapes", "modules")}

    def _out(self) -> str:
        self.runs += 1
        return os.path.join(self.tmp, f"run{self.runs}")

    def paratrace(self):
        out = self._out()
        self.last_trace[self.model] = os.path.join(out, "rank-0.arrow")
        return tracer.trace(out, clock_sync=False, flush_interval=self.flush_interval)

    def paratrace_python(self):
        """paratrace with the Python twins of its C hot path (as where it is not built)."""
        saved = tracer.session.StackInterner, tracer.session.ShapeSignatures
        tracer.session.StackInterner = PyStackInterner     # and so Python's on_op (session.py)
        tracer.session.ShapeSignatures = PyShapeSignatures
        try:
            return tracer.trace(self._out(), clock_sync=False,
                                flush_interval=self.flush_interval)
        finally:
            tracer.session.StackInterner, tracer.session.ShapeSignatures = saved

    def _without(self, part: str):
        return lambda: tracer.trace(self._out(), clock_sync=False,
                                    flush_interval=self.flush_interval,
                                    **{f"record_{part}": False})

    def paratrace_unrecorded(self):
        return tracer.trace(self._out(), clock_sync=False, steps="0",
                            flush_interval=self.flush_interval)

    @contextlib.contextmanager
    def profiler(self):
        """The profiler until its recording is in a file, as paratrace's is when it exits."""
        activities = [torch.profiler.ProfilerActivity.CPU]
        if DEVICE.type == "cuda":       # as paratrace records kernels on CUDA (docs/gpu.md)
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        prof = torch.profiler.profile(activities=activities, with_stack=True,
                                      record_shapes=True)
        with prof:
            yield prof
        prof.export_chrome_trace(os.path.join(self.tmp, "profiler.json"))

    @staticmethod
    def debug_mode():
        from torch.utils._debug_mode import DebugMode
        return DebugMode(record_stack_trace=True)


def measure(recorders: Recorders, models: list, rounds: int, steps: int) -> dict:
    """(model, recorder) -> per round: (wall, main thread's CPU, process CPU) seconds a step,
    the finishing work included (spread over the run's steps). Process CPU is a mean, not a
    median: the flusher's work lands in some steps and not others."""
    times = {(m, name): [] for m in models for name in recorders.factories}
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
    return times


def report(times: dict, recorders: Recorders, models: list) -> None:
    """Extra time: over the untraced step, of the in-run step time plus the recorder's
    finishing work per step (paratrace: the last flush; torch.profiler: processing its events
    at exit and writing its file), medians over rounds of each round's median step. Three
    clocks: wall; the main thread's CPU time, which neither other processes on the machine nor
    the recorder's own threads disturb (what the recorder costs the training thread); and the
    process's CPU time, every thread (what it costs the machine)."""
    clocks = ("wall", "main", "cpu")
    for model in models:
        ops_per_step = _ops_per_step(tracer.load(recorders.last_trace[model]))
        base = [statistics.median(t[i] for t in times[model, "untraced"]) for i in range(3)]
        print(f"\n{model}: reference GPT, one process on {DEVICE}, {' '.join(MODELS[model])}; "
              f"{ops_per_step} recorded ops a step")
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
                f"{(step[i] - base[i]) / ops_per_step * 1e6:7.2f}us" for i in range(3)))
        for i, clock in enumerate(clocks):
            floor, para = extra["no-op dispatch mode"][i], extra["paratrace"][i]
            prof, off = extra["torch.profiler"][i], extra["paratrace, unrecorded step"][i]
            print(f"{clock:4s}: paratrace extra / no-op mode extra {para / floor:5.2f} (target "
                  f"<= 2, stretch 1.5); / profiler extra {para / prof:5.2f} (target <= 1); "
                  f"unrecorded / untraced step {1 + off:5.3f} (target 1)")
        low = [extra["paratrace"][i] / extra[UNWRAPPED][i] for i in range(3)]
        print(f"paratrace extra / extra of the no-op mode without torch's Dynamo wrapper: "
              f"wall {low[0]:.2f}, main {low[1]:.2f}, cpu {low[2]:.2f}")
        print(paired_line(times, model, clocks))


def paired_line(times: dict, model: str, clocks: tuple) -> str:
    """paratrace's extra over the floor's within each round (the three run back to back, so a
    drift of the machine between rounds cancels): median and quartiles over rounds, per clock.
    On a model whose floor adds a fifth to the step, a 2 % wobble of one step moves that ratio
    by a tenth, which the ratio of medians above hides."""
    parts = []
    for i, clock in enumerate(clocks):
        ratios = sorted(
            (para[i] - base[i]) / (floor[i] - base[i])
            for base, floor, para in zip(times[model, "untraced"],
                                         times[model, "no-op dispatch mode"],
                                         times[model, "paratrace"])
            if floor[i] > base[i])
        if not ratios:
            parts.append(f"{clock} -")
            continue
        q1, q3 = np.percentile(ratios, [25, 75])
        parts.append(f"{clock} {statistics.median(ratios):.2f} [{q1:.2f}, {q3:.2f}]")
    rounds = len(times[model, "untraced"])
    return (f"per round: paratrace extra / no-op mode extra, median [quartiles] of {rounds} "
            f"rounds: {', '.join(parts)}")


def _ops_per_step(trace) -> int:
    """Recorded ops of a full step (the median over the steps but the last, partial one)."""
    real = ~np.isin(trace.col("op"), [trace.code("op", p) for p in PSEUDO_OPS])
    steps = trace.col("step")[real]
    return int(statistics.median(np.bincount(steps)[:-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--models", default="tiny,mid",
                        help=f"comma-separated, of {', '.join(MODELS)} (default tiny,mid; on "
                        "a GPU issue 15 asks for small,large)")
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
    global DEVICE
    DEVICE = torch.device(args.device)
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
    times = measure(recorders, models, args.rounds, args.steps)
    print(f"{args.rounds} interleaved rounds of {args.steps} steps (first dropped), medians; "
          f"load average at start {load[0]:.2f}, at end {os.getloadavg()[0]:.2f}, "
          f"{os.cpu_count()} CPUs")
    report(times, recorders, models)

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
