"""Tracer overhead, side by side in one run, on the reference GPT (one process, CPU).

Prints, for each recorder, the median step time over interleaved rounds and its ratio to the
untraced step: a bare no-op TorchDispatchMode (the floor any dispatch-mode tracer pays),
paratrace (stacks, shapes, modules), torch.profiler (with_stack=True, record_shapes=True) and
DebugMode(record_stack_trace=True). Then paratrace's bytes per event on disk and the reader's
events per second on a >= 1,000,000-event trace.

    python benchmarks/overhead.py [--rounds 5] [--steps 6] [--reader-events 1000000]

Targets (issue 2): paratrace's extra time at most half of the profiler's; <= 48 bytes/event;
the reader loads >= 1,000,000 events/s. The machine is noisy: rounds interleave the recorders so
load drifts hit all of them alike, and medians are reported.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import tracer  # noqa: E402
from sample_runs.config import parse_config  # noqa: E402
from sample_runs.parallel.process_groups import single_process_groups  # noqa: E402
from sample_runs.train import train  # noqa: E402
from tracer.format import TraceWriter  # noqa: E402

MODEL = ["--tp", "1", "--pp", "1", "--no-sp", "--layers", "2", "--hidden", "64", "--heads", "4",
         "--seq-len", "32", "--micro-batch-size", "2", "--microbatches", "2"]


class NoopMode(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def step_times(steps: int, recorder) -> list:
    """Seconds per optimizer step of a `steps`-step run under `recorder` (a context factory)."""
    stamps = []
    handle = register_optimizer_step_post_hook(lambda *a: stamps.append(time.perf_counter()))
    cfg = parse_config(MODEL + ["--steps", str(steps)], world_size=1)
    try:
        with recorder():
            start = time.perf_counter()
            with contextlib.redirect_stdout(open(os.devnull, "w")):
                train(cfg=cfg, groups=single_process_groups(), device=torch.device("cpu"))
    finally:
        handle.remove()
    edges = [start] + stamps
    return [b - a for a, b in zip(edges, edges[1:])][1:]      # the first step warms up


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--reader-events", type=int, default=1_000_000)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    tmp = tempfile.mkdtemp(prefix="paratrace-bench-")
    last_trace = {}

    def paratrace():
        out = os.path.join(tmp, f"run{len(last_trace)}")
        last_trace["dir"] = out
        last_trace[out] = True
        return tracer.trace(out, clock_sync=False)

    def profiler():
        return torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                      with_stack=True, record_shapes=True)

    def debug_mode():
        from torch.utils._debug_mode import DebugMode
        return DebugMode(record_stack_trace=True)

    recorders = {"untraced": contextlib.nullcontext, "no-op dispatch mode": NoopMode,
                 "paratrace": paratrace, "torch.profiler": profiler, "DebugMode": debug_mode}
    times = {name: [] for name in recorders}
    step_time(recorders, times, 1, 2)                          # warm every path up once
    times = {name: [] for name in recorders}
    for _ in range(args.rounds):
        step_time(recorders, times, 1, args.steps)
    base = statistics.median(times["untraced"])
    profiler_extra = statistics.median(times["torch.profiler"]) / base - 1
    print(f"reference GPT, one process, {MODEL}")
    print(f"{'recorder':22s} {'median step':>12s} {'ratio':>7s} {'extra':>7s}")
    for name, samples in times.items():
        median = statistics.median(samples)
        print(f"{name:22s} {median * 1e3:10.2f}ms {median / base:7.2f} {median / base - 1:7.2f}")
    para_extra = statistics.median(times["paratrace"]) / base - 1
    print(f"paratrace extra / profiler extra: {para_extra / profiler_extra:.2f} "
          f"(target <= 0.50)")
    floor_extra = statistics.median(times["no-op dispatch mode"]) / base - 1
    print(f"floor (no-op mode) extra / profiler extra: {floor_extra / profiler_extra:.2f}")

    trace_path = os.path.join(last_trace["dir"], "rank-0.arrow")
    trace = tracer.load(trace_path)
    size = os.path.getsize(trace_path)
    print(f"bytes per event on disk: {size / len(trace):.1f} ({len(trace)} events, {size} bytes;"
          f" target <= 48)")
    rate, n = reader_rate(trace, args.reader_events, tmp)
    print(f"reader: {rate:,.0f} events/s on a {n:,}-event trace (target >= 1,000,000)")


def step_time(recorders, times, rounds, steps) -> None:
    for _ in range(rounds):
        for name, recorder in recorders.items():
            times[name].extend(step_times(steps, recorder))


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
