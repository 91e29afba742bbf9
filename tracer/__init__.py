"""paratrace's recorder: every aten op and collective of this process, streamed to disk.

    import tracer
    with tracer.trace("traces/run1"):          # writes traces/run1/rank-<R>.arrow
        for batch in data:
            with tracer.annotate("F", microbatch=0):
                loss = model(batch)
            loss.backward()
            opt.step()                           # each optimizer step is a step boundary
    t = tracer.load("traces/run1/rank-0.arrow")

``annotate``, ``step`` and ``record_config`` cost next to nothing when no trace is active, so
instrumented code can call them unconditionally.
"""
from __future__ import annotations

import contextlib

from .files.format import FORMAT_VERSION, TraceError
from .files.reader import Trace, load
from .recorder import _active
from .recorder.options import TraceOptions

__all__ = ["trace", "annotate", "step", "record_config", "load", "active", "Trace", "TraceError",
           "FORMAT_VERSION"]

_NULL = contextlib.nullcontext()


def trace(traces_dir: str = "", *, steps=None, stack_depth: int = 64, library_frames: bool = False,
          record_shapes: bool = True, record_stacks: bool = True, record_modules: bool = True,
          user_paths=(), library=(), clock_sync: bool = True, flush_interval: float = 0.25,
          device_time: bool = True, compiled: str = "compiled", memory: bool = True,
          out_dir: str = ""):
    """Record this process into ``traces_dir/rank-<R>.arrow`` while the ``with`` block runs.

    Rank and world size come from torch.distributed once it is initialized (a process group
    created inside the block is picked up, and its clocks aligned to rank 0's), else from the
    RANK / WORLD_SIZE environment, else 0 / 1.

    Args:
        steps: which steps to record, e.g. ``"1-3"``, ``"0,2"``, ``"2-"`` (0-based; default all).
            Steps advance at every torch.optim optimizer step, or at each :func:`step` call.
        stack_depth: user frames kept per stack.
        library_frames: keep library frames (torch, the stdlib) too; by default only the
            boundary call into a library is kept.
        record_shapes / record_stacks / record_modules: turn the costlier context off.
        user_paths: directories whose files count as user code whatever ``library`` says.
        library: which packages are library (tracer.vocab.library): by default torch, the standard
            library and paratrace, and every other package is the user's (transformers,
            Lightning: their frames are kept). ``"accelerate"`` adds a package, ``"-torch"``
            makes one the user's, ``"site-packages"`` every installed package; comma lists
            or several specs, later ones refining earlier ones.
        clock_sync: estimate the offset to rank 0's clock at start and end (collective).
        flush_interval: seconds between flushes to disk (a killed rank loses at most this);
            every step boundary flushes too.
        device_time: on CUDA, record when each op's GPU work ran, in ``rank-<R>.device.arrow``:
            from CUPTI's activity API driven directly (the recorder's C module ``_cupti``, in
            the libcupti torch loaded), or through Kineto's windows where that module or
            libcupti is missing or ``PARATRACE_DEVICE_SOURCE=kineto`` (docs/gpu.md). Off, or
            without CUDA, op times are host times (on a GPU: launch times).
        compiled: ``"compiled"``: torch.compile'd code runs compiled, each compiled region is
            recorded as a range holding what it dispatches (extern kernels, fallbacks,
            collectives); ``"eager"``: it runs eagerly, every op recorded (docs/phases.md).
        memory: record each storage's allocation, free and category (parameters, gradients,
            optimizer state, activations, temporaries, comm) into the trace (format version
            4; docs/trace-format.md, "Memory"). On by default; ``memory=False`` records ops
            only, for less overhead (what each costs: docs/overhead.md, "Memory by
            default").
        out_dir: the older name of ``traces_dir``, still taken.
    """
    from .recorder.session import Session     # torch is imported only to record, not to read
    if not (traces_dir or out_dir):
        raise TypeError("tracer.trace() needs traces_dir: the directory the traces go into")
    return Session(traces_dir or out_dir, TraceOptions(
        steps=steps, stack_depth=stack_depth, library_frames=library_frames,
        record_shapes=record_shapes, record_stacks=record_stacks, record_modules=record_modules,
        user_paths=user_paths, library=library, clock_sync=clock_sync,
        flush_interval=flush_interval,
        device_time=device_time, compiled=compiled, memory=memory))


def annotate(label: str, **attrs):
    """A user range (context manager): every op inside carries it; the range is recorded too.

    Labels ``F``, ``B``, ``W`` (and ``forward``, ``backward``, ``recompute``, ``grad_sync`` or
    ``grad-sync``, ``optimizer``, ``other``) set the phase of the ops inside; ``phase=`` one of
    tracer.vocab.labels.PHASES does so for any label (docs/phases.md). Attributes must be
    JSON-serialisable (others are stored as their str()). torch.profiler.record_function ranges
    are recorded the same way.
    """
    active = _active.ACTIVE
    if active is None:
        return _NULL
    return active.annotate(label, attrs)


def step() -> None:
    """Mark a step boundary. Once called, optimizer steps no longer advance steps on their own."""
    active = _active.ACTIVE
    if active is not None:
        active.step()


def record_config(**values) -> None:
    """Store run configuration (parallel sizes, schedule...) in the trace; shown in reports."""
    active = _active.ACTIVE
    if active is not None:
        active.record_config(values)


def active():
    """The active recording session of this process, or None."""
    return _active.ACTIVE
