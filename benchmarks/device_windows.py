"""What closing a device window costs the training thread: the path before and the path now,
side by side in one run (issue 37).

The recorder (tracer/device.py) records GPU activity a window at a time (about one a second).
Two ways of closing a window, run in turn on the same model, round after round:

- ``torch.profiler`` (before): torch.profiler.profile stopped at the cut, its Chrome-trace
  export written there too, both on the training thread; the flusher parses it.
- ``binding`` (now): torch.autograd's profiler binding; the training thread only waits for the
  GPU and disables the profiler, the flusher saves the export and parses it.

Without a GPU (``--device cpu``, the default) the profiler's CPU activity stands in for CUDA, as
in tests/test_tracer_device.py: the windows, Kineto's export and the flusher's parse run for
real, with the CPU ops in place of kernels (about 7,600 events a step of the mid model).
``--device cuda`` records the CUDA activity on the first GPU.

Printed for each path: on the training thread, each cut (the profiler's stop and, before, the
export) and each window's start; on the flusher, each export (``_ProfilerResult.save``) and
parse; every step's wall time and the training thread's CPU time, median and worst, for the
steps where a window closed, the other steps the flusher's export or parse overlapped, and the
rest; then whether torch's binding holds the GIL (CPU only). NOTE: torch's export holds the
GIL and the parse is Python, so the flusher's work still delays the training thread while it
wants to run Python; its CPU time does not count that wait, its wall time does.

    python benchmarks/device_windows.py [--model mid] [--rounds 4] [--steps 40] [--window 1.0]
    python benchmarks/device_windows.py --device cuda --model large
"""
from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import overhead_recorders  # noqa: E402
import tracer  # noqa: E402
from overhead_recorders import MODELS, step_times  # noqa: E402
from tracer import device as device_module  # noqa: E402
from tracer import session as session_module  # noqa: E402
from tracer.device import BindingWindow, DeviceRecorder, ProfilerWindow  # noqa: E402

PATHS = ("torch.profiler", "binding")
LABELS = {"torch.profiler": "torch.profiler, export at the cut (before)",
          "binding": "binding, export on the flusher (now)"}


class Probe:
    """Wraps the recorder's steps to time them: (what, start, end, on the training thread)."""

    def __init__(self):
        self.events: list = []
        self.main = threading.main_thread().ident

    def _timed(self, what: str, fn):
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.events.append((what, t0, time.perf_counter(),
                                    threading.get_ident() == self.main))
        return timed

    def install(self) -> None:
        probe = self
        for cls in (BindingWindow, ProfilerWindow):
            stop = cls.stop

            def timed_stop(window, _stop=stop):
                t0 = time.perf_counter()
                save = _stop(window)
                probe.events.append(("stop", t0, time.perf_counter(),
                                     threading.get_ident() == probe.main))
                return probe._timed("export", save)
            cls.stop = timed_stop
        DeviceRecorder.cut = self._timed("cut", DeviceRecorder.cut)
        DeviceRecorder.start = self._timed("start", DeviceRecorder.start)
        device_module.load_chrome_trace = self._timed("parse", device_module.load_chrome_trace)

    def between(self, t0: float, t1: float) -> list:
        return [e for e in self.events if t0 <= e[1] < t1]


def run_once(model: str, steps: int, path: str, out: str, probe: Probe) -> list:
    """One traced run: per step (start, end, main-thread CPU seconds), and the probe's events."""
    DeviceRecorder.window_path = path
    marks = []
    def mark():
        marks.append((time.perf_counter(), time.thread_time()))
    probe.events = []
    step_times(model, steps, lambda: tracer.trace(out, clock_sync=False), mark)
    shutil.rmtree(out, ignore_errors=True)
    return [(a[0], b[0], b[1] - a[1]) for a, b in zip(marks, marks[1:])], list(probe.events)


def stats(values: list) -> str:
    if not values:
        return f"{'-':>9s} {'-':>9s}"
    return f"{statistics.median(values) * 1e3:7.1f}ms {max(values) * 1e3:7.1f}ms"


def report(path: str, steps: list, events: list) -> None:
    print(f"\n{LABELS[path]}")
    print(f"  {'on the training thread':42s} {'n':>4s} {'median':>9s} {'worst':>9s}")
    for what, label in (("cut", "window close (cut)"), ("stop", "  the profiler's stop"),
                        ("export", "  the export"), ("start", "next window's start")):
        values = [e[2] - e[1] for e in events if e[0] == what and e[3]]
        print(f"  {label:42s} {len(values):4d} {stats(values)}")
    print("  on the flusher")
    for what in ("export", "parse"):
        values = [e[2] - e[1] for e in events if e[0] == what and not e[3]]
        print(f"  {what:42s} {len(values):4d} {stats(values)}")
    print(f"  {'steps in which':31s} {'n':>4s} {'wall: median':>13s} {'worst':>9s}"
          f" {'main cpu: median':>17s} {'worst':>9s}")
    kinds = {"a window closed": [], "the flusher saved or parsed": [], "other": []}
    for t0, t1, cpu, cut, flusher in steps:
        kind = "a window closed" if cut else "the flusher saved or parsed" if flusher else "other"
        kinds[kind].append((t1 - t0, cpu))
    for kind, values in kinds.items():
        print(f"  {kind:31s} {len(values):4d}   {stats([v[0] for v in values])}"
              f"         {stats([v[1] for v in values])}")


def classify(steps: list, events: list) -> list:
    """Each step with whether a cut started in it and whether the flusher's export or parse of
    a window overlapped it."""
    out = []
    for t0, t1, cpu in steps:
        cut = any(e[0] == "cut" and e[3] and t0 <= e[1] < t1 for e in events)
        flusher = any(e[0] in ("export", "parse") and not e[3] and e[1] < t1 and e[2] > t0
                      for e in events)
        out.append((t0, t1, cpu, cut, flusher))
    return out


def gil_check(model: str) -> None:
    """Whether torch's binding holds the GIL: one window of the model's steps under the CPU
    activity, then the profiler's stop and the export each run on the main thread while a
    Python thread counts; its longest stall beside the call's own time (equal: held)."""
    parts = device_module.binding()
    if parts is None:
        return
    window = BindingWindow(parts, "CPU")
    window.start()
    step_times(model, 4, contextlib.nullcontext)
    save = beside_a_python_thread("the profiler's stop (_disable_profiler)", window.stop)
    path = os.path.join(tempfile.mkdtemp(prefix="paratrace-gil-"), "window.json")
    beside_a_python_thread("the export (_ProfilerResult.save)", lambda: save(path))
    shutil.rmtree(os.path.dirname(path), ignore_errors=True)


def beside_a_python_thread(what: str, call):
    """Run ``call`` while another thread runs Python; print both times; return its result."""
    running, longest = threading.Event(), [0.0]
    done = threading.Event()

    def count():
        last = time.perf_counter()
        running.set()
        while not done.is_set():
            now = time.perf_counter()
            longest[0] = max(longest[0], now - last)
            last = now
    thread = threading.Thread(target=count)
    thread.start()
    running.wait()
    time.sleep(0.02)                 # the counting thread holds the GIL in turns by now
    t0 = time.perf_counter()
    result = call()
    took = time.perf_counter() - t0
    done.set()
    thread.join()
    print(f"{what}: {took * 1e3:.1f} ms; a Python thread beside it stalled at most "
          f"{longest[0] * 1e3:.1f} ms")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mid", help=f"one of {', '.join(MODELS)}")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=40, help="steps a run")
    parser.add_argument("--window", type=float, default=device_module.WINDOW_S,
                        help="seconds a window lasts at least (the recorder's default: "
                        f"{device_module.WINDOW_S:g})")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args()
    if args.model not in MODELS:
        parser.error(f"--model: no model named {args.model} (choose from {', '.join(MODELS)})")
    if args.rounds < 1 or args.steps < 3 or args.window < 0:
        parser.error("--rounds >= 1, --steps >= 3 and --window >= 0")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA GPU on this machine")
    overhead_recorders.DEVICE = torch.device(args.device)
    torch.set_num_threads(1)
    if args.device == "cpu":          # the CPU activity stands in for CUDA
        session_module.cuda_in_use = lambda: True
        DeviceRecorder.activity = "CPU"
    device_module.WINDOW_S = args.window
    if device_module.binding() is None:
        print("note: this torch lacks torch.autograd's profiler binding: 'binding' runs "
              "torch.profiler, its export still on the flusher")
    if args.device == "cpu":
        print("GIL: torch's binding, one window of 4 steps, CPU activity")
        gil_check(args.model)
    probe = Probe()
    probe.install()
    tmp = tempfile.mkdtemp(prefix="paratrace-windows-")
    runs = {path: ([], []) for path in PATHS}
    load = os.getloadavg()
    try:
        for round_ in range(args.rounds + 1):      # round 0 warms up, not counted
            for path in PATHS:
                steps, events = run_once(args.model, args.steps if round_ else 3, path,
                                         os.path.join(tmp, f"{path}-{round_}"), probe)
                if round_:
                    runs[path][0].extend(classify(steps, events))
                    runs[path][1].extend(e for e in events if e[1] < steps[-1][1])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{args.rounds} interleaved rounds of {args.steps} steps of the {args.model} reference "
          f"GPT on {args.device} (activity {DeviceRecorder.activity}), windows of at least "
          f"{args.window:g} s; torch {torch.__version__}, {os.cpu_count()} CPUs, load average "
          f"{load[0]:.2f} at start, {os.getloadavg()[0]:.2f} at end. Events after the last "
          "step (the close's last window) are left out.")
    for path in PATHS:
        report(path, *runs[path])
    before, now = ([e[2] - e[1] for e in runs[p][1] if e[0] == "cut" and e[3]] for p in PATHS)
    if before and now:
        print(f"\na window's close on the training thread: before {stats(before)} "
              f"(median, worst), now {stats(now)}")


if __name__ == "__main__":
    main()
