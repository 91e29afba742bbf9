"""What closing a device window costs the training thread: the paths before and the path now,
side by side in one run (docs/overhead.md, "Closing a device window").

The recorder (tracer/recorder/device/kineto_windows.py) records GPU activity a window at a time
(about one a second). Four ways of closing a window, run in turn on the same model, round after
round:

- ``torch.profiler`` (first): torch.profiler.profile stopped at the cut, its Chrome-trace
  export written there too, both on the training thread; the flusher parses it.
- ``binding`` (second): torch.autograd's profiler binding; the training thread only waits for
  the GPU and disables the profiler, the flusher saves the export and parses it.
- ``flusher-save`` (third): the binding, the flusher saves the export and hands it to the
  recording's device worker, a process of its own that parses it and appends it to the device
  file (tracer/recorder/device/window_worker.py). ``binding`` and ``flusher-save`` save a window
  after the next one started: on CUDA that clamps every CUPTI time of it to 0
  (tracer/recorder/device/kineto_windows.py, NOTE), so their numbers are a cost, not a working
  recorder.
- ``worker`` (now): the binding, the export saved at the cut on the training thread before the
  next window starts, parsed in the worker.
- ``cupti-direct`` (CUDA only): no window at all. CUPTI's activity API driven directly
  (tracer/recorder/device/cupti_direct.py, ``PARATRACE_DEVICE_SOURCE=cupti``): CUPTI's own thread
  hands its buffers back, the flusher drains the rows; nothing is cut on the training thread.
- ``cupti-memory`` (CUDA only): ``cupti-direct`` with memory recorded too, the default
  recording (the other paths record ops only, ``memory=False``): issue 55's targets on a GPU.
- ``host-only`` (a baseline): the recorder with device time off (``device_time=False``), so
  that what device time adds shows apart from what the host recording costs.
- ``untraced`` (a baseline): the same steps with no recorder.

Without a GPU (``--device cpu``, the default) the profiler's CPU activity stands in for CUDA, as in
tests/integration/test_tracer_device.py: the windows, Kineto's export and the flusher's parse run
for real, with the CPU ops in place of kernels (about 7,600 events a step of the mid model).
``--device cuda`` records the CUDA activity on the first GPU.

Printed for each path: on the training thread, each cut (the profiler's stop and, first, the
export) and each window's start; on the flusher, the worker's start (``Popen``), each export
(``_ProfilerResult.save``), parse, or hand-over to the worker; in the worker, each window's
parse and write; every step's wall time and the training thread's CPU time, median and worst,
for the steps where a window closed, the other steps the flusher's or the worker's work
overlapped, and the rest; the session's close (it waits for the worker). First, whether torch's
binding holds the GIL (CPU only) and what starting a worker costs. NOTE: torch's export holds
the GIL and the in-process parse is Python, so the flusher's work still delays the training
thread while it wants to run Python; its CPU time does not count that wait, its wall time does.
The worker shares no GIL, only the machine's cores.

    python benchmarks/device_windows.py [--model mid] [--rounds 4] [--steps 40] [--window 1.0]
                                        [--paths torch.profiler,binding,flusher-save,worker]
    python benchmarks/device_windows.py --device cuda --model large
"""
from __future__ import annotations

import argparse
import contextlib
import json
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
from tracer.recorder.device import kineto_windows as device_module
from tracer.recorder import session as session_module
from tracer.recorder.device.kineto_windows import (  # noqa: E402
    BindingWindow, DeviceRecorder, ProfilerWindow)
from tracer.recorder.device import cupti_direct as device_direct  # noqa: E402
from tracer.recorder.device.cupti_direct import SOURCE_ENV, DirectDeviceRecorder  # noqa: E402
from tracer.recorder.device.window_worker import DeviceWorker  # noqa: E402

# path -> (DeviceRecorder.window_path, .parse_in, .export_at)
PATHS = {"torch.profiler": ("torch.profiler", "flusher", "cut"),
         "binding": ("binding", "flusher", "flusher"),
         "flusher-save": ("binding", "worker", "flusher"),
         "worker": ("binding", "worker", "cut"),
         "cupti-direct": ("binding", "worker", "cut"),
         "cupti-memory": ("binding", "worker", "cut"),
         "host-only": ("binding", "worker", "cut"),
         "untraced": ("binding", "worker", "cut")}
DEFAULT_PATHS = ("torch.profiler", "binding", "flusher-save", "worker")
LABELS = {"torch.profiler": "torch.profiler, export at the cut, parse on the flusher (first)",
          "binding": "binding, export and parse on the flusher (second; times lost on CUDA)",
          "flusher-save": "binding, export on the flusher, parse in the worker (third; times "
                          "lost on CUDA)",
          "worker": "binding, export at the cut, parse in the worker (now)",
          "cupti-direct": "CUPTI directly: no window, the flusher drains CUPTI's rows",
          "cupti-memory": "CUPTI directly, memory recorded too (the default recording)",
          "host-only": "the recorder without device time (its host cost alone)",
          "untraced": "untraced (no recorder)"}
SHORT = {"torch.profiler": "torch.profiler (first)", "binding": "binding, parse here (second)",
         "flusher-save": "binding, save on the flusher (third)",
         "worker": "binding, save at the cut (now)", "cupti-direct": "CUPTI directly",
         "cupti-memory": "CUPTI directly, memory",
         "host-only": "host only (no device time)", "untraced": "untraced"}


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
        DirectDeviceRecorder.start = self._timed("start", DirectDeviceRecorder.start)
        DirectDeviceRecorder.write_pending = self._timed("drain",
                                                         DirectDeviceRecorder.write_pending)
        device_module.load_chrome_trace = self._timed("parse", device_module.load_chrome_trace)
        DeviceWorker.__init__ = self._timed("spawn", DeviceWorker.__init__)
        DeviceWorker.send = self._timed("send", DeviceWorker.send)
        answered = DeviceWorker._answered

        def worker_span(worker, line):       # the worker's own clock: CLOCK_MONOTONIC
            answer = json.loads(line)
            if isinstance(answer, dict) and "span" in answer:
                probe.events.append(("worker", *answer["span"], False))
            return answered(worker, line)
        DeviceWorker._answered = worker_span

    def between(self, t0: float, t1: float) -> list:
        return [e for e in self.events if t0 <= e[1] < t1]


def run_once(model: str, steps: int, path: str, out: str, probe: Probe) -> tuple:
    """One traced run: per step (start, end, main-thread CPU seconds), the probe's events, and
    the wall seconds the session's close took."""
    (DeviceRecorder.window_path, DeviceRecorder.parse_in,
     DeviceRecorder.export_at) = PATHS[path]
    marks = []
    def mark():
        marks.append((time.perf_counter(), time.thread_time()))
    probe.events = []
    os.environ[SOURCE_ENV] = "cupti" if path.startswith("cupti-") else "kineto"
    recorder = contextlib.nullcontext if path == "untraced" else \
        (lambda: tracer.trace(out, clock_sync=False, device_time=path != "host-only",
                              memory=path == "cupti-memory"))
    closed = step_times(model, steps, recorder, mark)[2]
    shutil.rmtree(out, ignore_errors=True)
    return ([(a[0], b[0], b[1] - a[1]) for a, b in zip(marks, marks[1:])], list(probe.events),
            closed)


def stats(values: list) -> str:
    if not values:
        return f"{'-':>9s} {'-':>9s}"
    return f"{statistics.median(values) * 1e3:7.1f}ms {max(values) * 1e3:7.1f}ms"


BACKGROUND = "the flusher or the worker saved or parsed"


def report(path: str, steps: list, events: list, closes: list) -> None:
    print(f"\n{LABELS[path]}")
    print(f"  {'on the training thread':42s} {'n':>4s} {'median':>9s} {'worst':>9s}")
    for what, label in (("cut", "window close (cut)"), ("stop", "  the profiler's stop"),
                        ("export", "  the export"), ("start", "next window's start")):
        values = [e[2] - e[1] for e in events if e[0] == what and e[3]]
        print(f"  {label:42s} {len(values):4d} {stats(values)}")
    print("  on the flusher")
    for what, label in (("spawn", "the worker's start (Popen)"), ("export", "export"),
                        ("parse", "parse"), ("send", "hand-over to the worker"),
                        ("drain", "CUPTI's rows drained and written")):
        values = [e[2] - e[1] for e in events if e[0] == what and not e[3]]
        print(f"  {label:42s} {len(values):4d} {stats(values)}")
    values = [e[2] - e[1] for e in events if e[0] == "worker"]
    print(f"  {'in the worker: parse and write':42s} {len(values):4d} {stats(values)}")
    print(f"  {'the session close (waits for the worker)':42s} {len(closes):4d} {stats(closes)}")
    print(f"  {'steps in which':40s} {'n':>4s} {'wall: median':>13s} {'worst':>9s}"
          f" {'main cpu: median':>17s} {'worst':>9s}")
    for kind, values in step_kinds(steps).items():
        print(f"  {kind:40s} {len(values):4d}   {stats([v[0] for v in values])}"
              f"         {stats([v[1] for v in values])}")


def step_kinds(steps: list) -> dict:
    """(wall, main-thread CPU) of the steps, by what happened in them."""
    kinds = {"a window closed": [], BACKGROUND: [], "other": []}
    for t0, t1, cpu, cut, background in steps:
        kind = "a window closed" if cut else BACKGROUND if background else "other"
        kinds[kind].append((t1 - t0, cpu))
    return kinds


def classify(steps: list, events: list) -> list:
    """Each step with whether a cut started in it and whether the flusher's export or parse,
    or the worker's parse, of a window overlapped it."""
    out = []
    for t0, t1, cpu in steps:
        cut = any(e[0] == "cut" and e[3] and t0 <= e[1] < t1 for e in events)
        background = any(e[0] in ("export", "parse", "worker", "drain") and not e[3] and e[1] < t1
                         and e[2] > t0 for e in events)
        out.append((t0, t1, cpu, cut, background))
    return out


def worker_start_cost(times: int = 5) -> None:
    """Start a worker ``times`` times: the Popen call (the recorder's thread, once a
    recording), until its imports are done (its ``ready`` line), its memory then."""
    tmp = tempfile.mkdtemp(prefix="paratrace-worker-")
    popen, ready, rss = [], [], []
    try:
        for i in range(times):
            t0 = time.perf_counter()
            worker = DeviceWorker(os.path.join(tmp, f"rank-{i}.device.arrow"), i)
            popen.append(time.perf_counter() - t0)
            line = worker.proc.stdout.readline()
            ready.append(time.perf_counter() - t0)
            assert json.loads(line) == {"ready": True}, line
            with open(f"/proc/{worker.proc.pid}/status") as fh:
                rss += [int(x.split()[1]) / 1024 for x in fh if x.startswith("VmRSS:")]
            worker.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"the worker's start, {times} times: Popen {stats(popen)} (median, worst), until "
          f"ready {stats(ready)}; its memory then {statistics.median(rss):.0f} MB "
          f"(VmRSS, median)")


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
    parser.add_argument("--paths", default=",".join(DEFAULT_PATHS),
                        help=f"which paths, in turn, of {', '.join(PATHS)} (default: "
                        f"{','.join(DEFAULT_PATHS)})")
    args = parser.parse_args()
    args.paths = [p for p in args.paths.split(",") if p]
    if not args.paths or any(p not in PATHS for p in args.paths):
        parser.error(f"--paths: a comma-separated list of {', '.join(PATHS)}")
    cupti = [p for p in args.paths if p.startswith("cupti-")]
    if cupti and args.device != "cuda":
        parser.error(f"--paths {cupti[0]}: CUPTI records CUDA only (--device cuda)")
    if cupti and device_direct.native()[0] is None:
        parser.error(f"--paths {cupti[0]}: {device_direct.native()[1]}")
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
        print("note: this torch lacks torch.autograd's profiler binding: 'binding' and "
              "'flusher-save' and 'worker' run torch.profiler.profile")
    if args.device == "cpu":
        print("GIL: torch's binding, one window of 4 steps, CPU activity")
        gil_check(args.model)
    worker_start_cost()
    probe = Probe()
    probe.install()
    tmp = tempfile.mkdtemp(prefix="paratrace-windows-")
    paths = args.paths
    runs = {path: ([], [], []) for path in paths}
    load = os.getloadavg()
    try:
        for round_ in range(args.rounds + 1):      # round 0 warms up, not counted
            for path in paths:
                steps, events, closed = run_once(args.model, args.steps if round_ else 3,
                                                 path, os.path.join(tmp, f"{path}-{round_}"),
                                                 probe)
                if round_:
                    runs[path][0].extend(classify(steps, events))
                    runs[path][1].extend(e for e in events if e[1] < steps[-1][1])
                    runs[path][2].append(closed)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{args.rounds} interleaved rounds of {args.steps} steps of the {args.model} reference "
          f"GPT on {args.device} (activity {DeviceRecorder.activity}), windows of at least "
          f"{args.window:g} s; torch {torch.__version__}, {os.cpu_count()} CPUs, load average "
          f"{load[0]:.2f} at start, {os.getloadavg()[0]:.2f} at end. Events after the last "
          "step (the close's last window) are left out.")
    for path in paths:
        report(path, *runs[path])
    # NOTE: a window lasts at least --window seconds of steps: where closing one costs less,
    # a window holds more steps, and its stop, export and parse more events. The steps' sum
    # (every path runs the same steps) is the comparison that does not depend on it.
    print(f"\n{'side by side':36s} {'closing step: wall':>19s} {'main cpu':>19s} "
          f"{'windows':>7s} {'all steps: wall':>15s} {'main cpu':>9s}")
    print(f"{'':36s} {'median':>9s} {'worst':>9s} {'median':>9s} {'worst':>9s} {'':7s} "
          f"{'sum':>15s} {'sum':>9s}")
    for path in paths:
        closing = step_kinds(runs[path][0])["a window closed"]
        print(f"{SHORT[path]:36s} {stats([v[0] for v in closing])} "
              f"{stats([v[1] for v in closing])} {len(closing):7d} "
              f"{sum(s[1] - s[0] for s in runs[path][0]):14.2f}s "
              f"{sum(s[2] for s in runs[path][0]):8.2f}s")
    # issue 37's targets: a mean step at most 1.03x untraced, no step over 1.10x the median
    print(f"\n{'every step':36s} {'median':>9s} {'mean':>9s} {'worst':>9s} "
          f"{'worst/median':>12s} {'mean/untraced':>13s}")
    base = runs.get("untraced")
    base_mean = statistics.mean(s[1] - s[0] for s in base[0]) if base else None
    for path in paths:
        walls = [s[1] - s[0] for s in runs[path][0]]
        mean = statistics.mean(walls)
        ratio = f"{mean / base_mean:12.3f}x" if base_mean else f"{'-':>13s}"
        print(f"{SHORT[path]:36s} {statistics.median(walls) * 1e3:7.1f}ms {mean * 1e3:7.1f}ms "
              f"{max(walls) * 1e3:7.1f}ms {max(walls) / statistics.median(walls):11.3f}x "
              f"{ratio}")


if __name__ == "__main__":
    main()
