"""The recorders benchmarks/overhead.py compares, and one timed run of the reference GPT under
each: shared by overhead.py (wall and CPU time) and overhead_callgrind.py (instructions), so
neither imports the other."""
from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time

import numpy as np
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import tracer  # noqa: E402
import tracer.recorder.session  # noqa: E402
from sample_runs.config import parse_config  # noqa: E402
from sample_runs.parallel.process_groups import single_process_groups  # noqa: E402
from sample_runs.train import train  # noqa: E402
from tracer.vocab.ops import PSEUDO_OPS  # noqa: E402
from tracer.recorder.attribution.shapes import PyShapeSignatures  # noqa: E402
from tracer.recorder.attribution.stacks import PyStackInterner, StackInterner  # noqa: E402


_COMMON = ["--tp", "1", "--pp", "1", "--no-sp", "--layers", "4", "--heads", "4",
           "--micro-batch-size", "2", "--microbatches", "2"]
MODELS = {
    "tiny": _COMMON + ["--hidden", "32", "--seq-len", "16"],     # ops of a few microseconds
    "mid": _COMMON + ["--hidden", "192", "--seq-len", "64"],     # ops of tens of microseconds
    # the GPU models of docs/overhead.md's targets (--device cuda): the small reference GPT of its H100 numbers and of
    # tests/assets/gpu-h100, and the hidden-1024 one of docs/gpu.md
    "small": ["--tp", "1", "--pp", "1", "--no-sp", "--layers", "4", "--heads", "4",
              "--hidden", "256", "--seq-len", "256", "--micro-batch-size", "4",
              "--microbatches", "2"],
    "large": ["--tp", "1", "--pp", "1", "--no-sp", "--layers", "8", "--heads", "16",
              "--hidden", "1024", "--seq-len", "1024", "--micro-batch-size", "4",
              "--microbatches", "2"],
}
DEVICE = torch.device("cpu")     # --device; on CUDA every step stamp waits for the GPU
UNWRAPPED = "no-op mode, no Dynamo wrapper"
MEMORY, PROFILE_MEMORY = "paratrace, memory", "torch.profiler, profile_memory"


class NoopMode(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


class UnwrappedNoopMode(TorchDispatchMode):
    """The no-op mode without the torch._dynamo.disable wrapper that torch (2.13: for every
    mode whose _should_skip_dynamo() is True, the default) puts around __torch_dispatch__;
    paratrace leaves it out too (tracer/recorder/hotpath/_mode.py), so this is the floor its own
    design pays."""
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
                          self.paratrace_unrecorded, "torch.profiler": self.profiler,
                          # memory (tracer/recorder/memory/memory_recorder.py) beside
                          # torch's memory profiler
                          MEMORY: self.paratrace_memory, PROFILE_MEMORY: self.memory_profiler}
        # what the C hot path buys (tracer/recorder/csrc/hotpath/)
        if StackInterner.HOT_PATH == "c":
            self.factories["paratrace, Python hot path"] = self.paratrace_python
        if debug_mode:
            self.factories["DebugMode"] = self.debug_mode
        # what each part of the recording costs: paratrace with one of them off
        self.ablations = {f"paratrace without {part}": self._without(part)
                          for part in ("stacks", "shapes", "modules")}

    def _out(self) -> str:
        self.runs += 1
        return os.path.join(self.tmp, f"run{self.runs}")

    def _trace(self, **options):
        """tracer.trace into a fresh directory; ops only unless ``memory=True`` is given, so a
        recorder's name keeps its meaning whatever the default is."""
        options.setdefault("memory", False)
        return tracer.trace(self._out(), clock_sync=False, flush_interval=self.flush_interval,
                            **options)

    def paratrace(self):
        """paratrace recording ops only (``memory=False``)."""
        self.last_trace[self.model] = os.path.join(self.tmp, f"run{self.runs + 1}",
                                                   "rank-0.arrow")
        return self._trace()

    def paratrace_memory(self):
        """paratrace recording ops and memory (``memory=True``)."""
        return self._trace(memory=True)

    def paratrace_python(self, **options):
        """paratrace with the Python twins of its C hot path (as where it is not built)."""
        saved = tracer.recorder.session.StackInterner, tracer.recorder.session.ShapeSignatures
        tracer.recorder.session.StackInterner = PyStackInterner     # and so Python's on_op
        tracer.recorder.session.ShapeSignatures = PyShapeSignatures
        try:
            return self._trace(**options)
        finally:
            tracer.recorder.session.StackInterner, tracer.recorder.session.ShapeSignatures = saved

    def _without(self, part: str):
        return lambda: self._trace(**{f"record_{part}": False})

    def paratrace_unrecorded(self):
        return self._trace(steps="0")

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

    @contextlib.contextmanager
    def memory_profiler(self):
        """torch.profiler with ``profile_memory=True`` (its allocations and frees, no stacks,
        no shapes), until its recording is in a file: the memory tool users compare with."""
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                      profile_memory=True, record_shapes=False,
                                      with_stack=False)
        with prof:
            yield prof
        prof.export_chrome_trace(os.path.join(self.tmp, "profiler-memory.json"))

    @staticmethod
    def debug_mode():
        from torch.utils._debug_mode import DebugMode
        return DebugMode(record_stack_trace=True)


def ops_per_step(trace) -> int:
    """Recorded ops of a full step (the median over the steps but the last, partial one)."""
    real = ~np.isin(trace.col("op"), [trace.code("op", p) for p in PSEUDO_OPS])
    steps = trace.col("step")[real]
    return int(statistics.median(np.bincount(steps)[:-1]))
