"""Memory-tracking candidates' extra time, side by side in one run, on the reference GPT (one
process, CPU), before per-rank memory recording is built (docs/overhead.md, "Memory tracking:
the candidates, measured").

Times training steps under:

- untraced;
- a bare no-op TorchDispatchMode (overhead_recorders.NoopMode): the floor of the targets;
- storages + weakref.finalize: a no-op mode that, for each op output, looks up its untyped
  storage, keys it by the storage's ``_cdata`` (its C++ StorageImpl: unique while alive, and
  zero-byte storages, whose data_ptr is 0, don't collide), and on first sight records
  (bytes, time) and puts a ``weakref.finalize`` on the storage to record its free;
- storages + weakref.ref callback: the same with a ``weakref.ref`` and a callback, kept in the
  table, as torch/distributed/_tools/mem_tracker.py does (cheaper than finalize's registry);
- storages, first sight only: the same without any finalizer, to split the cost (it never
  forgets a key, so a new storage at a freed one's address would be missed: timing only);
- torch.profiler(profile_memory=True, record_shapes=False, with_stack=False), its chrome trace
  written at exit as overhead.py's profiler does;
- paratrace (``tracer.trace``), for reference; paratrace with its Python hot path; paratrace
  with ``memory=True``, memory recording as built (tracer/recorder/memory/memory_recorder.py;
  docs/overhead.md, "Memory recording as built"), on its C hot path and on the Python twins.

Rounds alternate the mechanisms as overhead.py does (overhead.measure), medians over rounds.
Then a correctness check of the finalize mechanism, run under torch.profiler(profile_memory)
at once: at each step's end its running live bytes against the sum of nbytes of the tracked
storages still alive, and its peak rise within each step against the one the profiler's
[memory] events give for the same step.

    OMP_NUM_THREADS=1 python benchmarks/memory_mechanisms.py [--rounds 2] [--steps 3]
        [--models small] [--check-steps 3] [--mechanisms "NAME;NAME"] [--no-check]
        [--device cpu|cuda]
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
import time
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import overhead  # noqa: E402
import overhead_recorders  # noqa: E402
import tracer  # noqa: E402
from overhead_recorders import MODELS, NoopMode, Recorders, step_times  # noqa: E402

_Tensor = torch.Tensor


class StorageMode(TorchDispatchMode):
    """Live bytes from op outputs' storages. ``free``: "finalize" (weakref.finalize),
    "ref" (weakref.ref with a callback, kept in the table) or None (first sight only).
    ``events``: (signed bytes, perf_counter_ns) per first sight and per free."""

    def __init__(self, free: str | None = "finalize"):
        super().__init__()
        self.free = free
        self.live: dict = {}            # storage _cdata -> nbytes (or (nbytes, weakref))
        self.live_bytes = 0
        self.peak = 0
        self.events: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, _Tensor):
            self._see(out)
        elif isinstance(out, (tuple, list)):
            for t in out:
                if isinstance(t, _Tensor):
                    self._see(t)
                elif isinstance(t, (tuple, list)):
                    for u in t:
                        if isinstance(u, _Tensor):
                            self._see(u)
        return out

    def _see(self, t) -> None:
        st = t.untyped_storage()
        key = st._cdata
        if key in self.live:
            return
        n = st.nbytes()
        self.events.append((n, time.perf_counter_ns()))
        self.live_bytes += n
        if self.live_bytes > self.peak:
            self.peak = self.live_bytes
        if self.free == "finalize":
            self.live[key] = n
            weakref.finalize(st, self._freed, key, n)
        elif self.free == "ref":
            self.live[key] = n, weakref.ref(st, lambda _r, k=key, b=n: self._freed(k, b))
        else:
            self.live[key] = n

    def _freed(self, key, n) -> None:
        del self.live[key]
        self.live_bytes -= n
        self.events.append((-n, time.perf_counter_ns()))


class CheckedStorageMode(StorageMode):
    """The finalize mechanism, also keeping a plain weakref to every tracked storage: the
    separate count (sum of nbytes of tracked storages still alive) the check compares with."""

    def __init__(self):
        super().__init__("finalize")
        self.refs: dict = {}

    def _see(self, t) -> None:
        st = t.untyped_storage()
        if st._cdata not in self.live:
            self.refs[st._cdata] = weakref.ref(st)
        super()._see(t)

    def _freed(self, key, n) -> None:
        self.refs.pop(key, None)
        super()._freed(key, n)

    def separate_count(self) -> tuple:
        alive = [r() for r in self.refs.values()]
        alive = [s for s in alive if s is not None]
        return sum(s.nbytes() for s in alive), len(alive)


class MemoryRecorders(Recorders):
    """overhead.py's Recorders with the memory candidates as its factories."""

    def __init__(self, tmp: str):
        super().__init__(tmp, debug_mode=False)
        self.factories = {
            "untraced": contextlib.nullcontext,
            "no-op dispatch mode": NoopMode,
            "storages + weakref.finalize": lambda: StorageMode("finalize"),
            "storages + weakref.ref cb": lambda: StorageMode("ref"),
            "storages, first sight only": lambda: StorageMode(None),
            "profiler, profile_memory": self.memory_profiler,
            "paratrace": self.paratrace,
            "paratrace, Python hot path": self.paratrace_python,
            "paratrace, memory": self.paratrace_memory,
            "paratrace, memory, Python hot path": self.paratrace_memory_python,
        }

    def paratrace_memory_python(self):
        """paratrace with memory recording on the Python twins of its hot path (as before the
        C on_op took memory, and where it is not built)."""
        return self.paratrace_python(memory=True)


def report(times: dict, seen: dict, names: list, model: str) -> None:
    base = [statistics.median(t[i] for t in times[model, "untraced"]) for i in range(2)]
    extra = {}
    print(f"\n{model}: reference GPT, one process on {overhead_recorders.DEVICE.type}, "
          f"{' '.join(MODELS[model])}")
    print(f"{'mechanism':28s} {'wall step':>10s} {'extra':>6s} {'main cpu':>10s} {'extra':>6s}"
          f" {'x no-op':>7s} {'worst wall':>10s} {'x median':>8s}")
    for name in names:
        step = [statistics.median(t[i] for t in times[model, name]) for i in range(2)]
        extra[name] = [step[i] / base[i] - 1 for i in range(2)]
    floor = extra["no-op dispatch mode"]
    for name in names:
        step = [statistics.median(t[i] for t in times[model, name]) for i in range(2)]
        walls = [s[0] for s in seen[model, name]]
        med, worst = statistics.median(walls), max(walls)
        ratio = extra[name][0] / floor[0] if floor[0] > 0 else float("nan")
        print(f"{name:28s} {step[0] * 1e3:8.2f}ms {extra[name][0]:6.3f} "
              f"{step[1] * 1e3:8.2f}ms {extra[name][1]:6.3f} {ratio:7.2f} "
              f"{worst * 1e3:8.2f}ms {worst / med:8.2f}")
    prof = extra.get("profiler, profile_memory", [float("nan")] * 2)
    for i, clock in enumerate(("wall", "main cpu")):
        if floor[i] <= 0:
            print(f"{clock}: no-op mode extra <= 0, no ratios")
            continue
        print(f"{clock}: extra / no-op mode extra (budget <= 2) and / profile_memory extra "
              "(budget <= 1): " + "; ".join(
                  f"{n} {extra[n][i] / floor[i]:.2f}, {extra[n][i] / prof[i]:.2f}"
                  for n in names if n.startswith(("storages", "paratrace"))))
    for name in names:
        if name.startswith("storages") and floor[0] > 0 and "paratrace" in extra:
            both = extra["paratrace"][0] + extra[name][0] - floor[0]
            print(f"paratrace + {name} (estimated: paratrace extra + its extra - no-op "
                  f"extra), wall: / no-op extra {both / floor[0]:.2f}, / profile_memory "
                  f"extra {both / prof[0]:.2f}")
    paired(times, model, names)
    print(overhead.worst_lines(seen, model))


def paired(times: dict, model: str, names: list) -> None:
    """Per round (the mechanisms ran back to back): extra / no-op mode extra, wall clock."""
    parts = []
    for name in names:
        if not name.startswith(("storages", "paratrace")):
            continue
        ratios = sorted((m[0] - b[0]) / (f[0] - b[0]) for b, f, m in zip(
            times[model, "untraced"], times[model, "no-op dispatch mode"], times[model, name])
            if f[0] > b[0])
        if ratios:
            parts.append(f"{name} {statistics.median(ratios):.2f} "
                         f"[{ratios[0]:.2f}..{ratios[-1]:.2f}]")
    print("per round, wall extra / no-op extra, median [min..max]: " + "; ".join(parts))


def check(model: str, steps: int, tmp: str) -> None:
    """The finalize mechanism under torch.profiler(profile_memory=True), the same steps."""
    mode = CheckedStorageMode()
    ends = []      # per step end: perf_counter_ns, live bytes, separate count, tracked, peak

    def on_step():
        count, alive = mode.separate_count()
        ends.append((time.perf_counter_ns(), mode.live_bytes, count, alive, mode.peak))
        mode.peak = mode.live_bytes

    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                  profile_memory=True, record_shapes=False, with_stack=False)

    @contextlib.contextmanager
    def both():
        with prof, mode:
            yield

    step_times(model, steps, both, on_step)
    path = os.path.join(tmp, "check.json")
    prof.export_chrome_trace(path)
    events = json.load(open(path))["traceEvents"]
    mem = sorted((e["ts"], e["args"]["Bytes"]) for e in events
                 if e.get("name") == "[memory]" and e["args"].get("Device Type") == 0)
    step_end = sorted(e["ts"] + e["dur"] for e in events
                      if e.get("name", "").startswith("Optimizer.step#"))
    # profiler: live bytes allocated since it started, at each step end and peak within steps
    prof_steps, live, peak, j = [], 0, 0, 0
    for end in step_end:
        while j < len(mem) and mem[j][0] <= end:
            live += mem[j][1]
            peak = max(peak, live)
            j += 1
        prof_steps.append((live, peak))
        peak = live
    print(f"\ncheck ({model}, {steps} steps, finalize mechanism inside "
          f"torch.profiler(profile_memory=True); MB = 1e6 bytes; the profiler counts from its "
          f"start, the mechanism from its first sight):")
    print(f"{'step':>4s} {'mech live':>10s} {'separate':>10s} {'equal':>5s} {'tracked':>7s} "
          f"{'mech peak':>10s} {'rise':>8s} {'prof live':>10s} {'prof peak':>10s} "
          f"{'rise':>8s} {'rise mech/prof':>14s}")
    for i, ((_, live_b, count, alive, mpeak), (plive, ppeak)) in enumerate(
            zip(ends, prof_steps)):
        if i == 0:
            prev_m, prev_p = live_b, plive
            print(f"{i:4d} {live_b / 1e6:10.3f} {count / 1e6:10.3f} {str(live_b == count):>5s} "
                  f"{alive:7d} {mpeak / 1e6:10.3f} {'':8s} {plive / 1e6:10.3f} "
                  f"{ppeak / 1e6:10.3f} (warm-up step: model built in it)")
            continue
        rise_m, rise_p = mpeak - prev_m, ppeak - prev_p
        print(f"{i:4d} {live_b / 1e6:10.3f} {count / 1e6:10.3f} {str(live_b == count):>5s} "
              f"{alive:7d} {mpeak / 1e6:10.3f} {rise_m / 1e6:8.3f} {plive / 1e6:10.3f} "
              f"{ppeak / 1e6:10.3f} {rise_p / 1e6:8.3f} {rise_m / rise_p:14.3f}")
        prev_m, prev_p = live_b, plive
    first = sum(1 for n, _ in mode.events if n > 0)
    print(f"mechanism events: {first} first sights, {len(mode.events) - first} frees; "
          f"profiler [memory] events: {len(mem)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--models", default="small",
                        help=f"comma-separated, of {', '.join(MODELS)} (default small)")
    parser.add_argument("--check-steps", type=int, default=3)
    parser.add_argument("--mechanisms", default=None,
                        help="';'-separated subset of the mechanisms to time (untraced and "
                        "the no-op mode always run)")
    parser.add_argument("--no-check", action="store_true", help="skip the correctness check")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where the model trains (cuda: scripts/gpu_checks.sh memory; "
                        "each step stamp waits for the GPU)")
    args = parser.parse_args()
    models = args.models.split(",")
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        parser.error(f"--models: no model named {', '.join(unknown)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no GPU here")
    if args.device == "cuda" and not args.no_check:
        parser.error("--device cuda needs --no-check (the check counts CPU storages)")
    overhead_recorders.DEVICE = torch.device(args.device)
    torch.set_num_threads(1)
    tmp = tempfile.mkdtemp(prefix="paratrace-mem-")
    try:
        recorders = MemoryRecorders(tmp)
        if args.mechanisms:
            wanted = {"untraced", "no-op dispatch mode", *args.mechanisms.split(";")}
            unknown = wanted - set(recorders.factories)
            if unknown:
                parser.error(f"--mechanisms: none named {', '.join(sorted(unknown))}")
            recorders.factories = {n: f for n, f in recorders.factories.items() if n in wanted}
        names = list(recorders.factories)
        load = os.getloadavg()
        times, seen = overhead.measure(recorders, models, args.rounds, args.steps)
        print(f"{args.rounds} interleaved rounds of {args.steps} steps (first dropped), "
              f"medians; load average at start {load[0]:.2f}, at end "
              f"{os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs, "
              f"torch {torch.__version__}")
        for model in models:
            report(times, seen, names, model)
        for model in models if not args.no_check else ():
            check(model, args.check_steps, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
