"""Recording options: the :class:`TraceOptions` record and the ``--steps`` parser, usable before
anything heavy is imported (trace-run checks them before it launches a worker). Torch-free."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from tracer.vocab.library import parse_specs


def parse_steps(spec) -> Optional[Callable[[int], bool]]:
    """'2-4,7,10-' -> predicate on step index (0-based); None or '' or 'all': every step."""
    if spec is None or (isinstance(spec, str) and spec.strip().lower() in ("", "all")):
        return None
    if isinstance(spec, int):
        spec = str(spec)
    ranges = []
    for part in str(spec).split(","):
        part = part.strip()
        if not part:
            continue
        if part.startswith("-"):     # '-1' reads as "the last step" to a Python user
            raise ValueError(f"bad step selection {spec!r}: a range needs its first step "
                             f"(steps count from 0: '0{part}'; '2-' is step 2 onwards)")
        try:
            if "-" in part:
                lo, hi = part.split("-", 1)
                ranges.append((int(lo), int(hi) if hi else None))
            else:
                ranges.append((int(part), int(part)))
        except ValueError:
            raise ValueError(f"bad step selection {spec!r}: use e.g. '1-3', '0,2', '2-'") from None
        if ranges[-1][0] < 0 or (ranges[-1][1] is not None and ranges[-1][1] < ranges[-1][0]):
            raise ValueError(f"bad step selection {spec!r}: ranges must be ascending, >= 0")
    if not ranges:
        raise ValueError(f"bad step selection {spec!r}: it selects no step; use e.g. '1-3'")
    return lambda step: any(lo <= step and (hi is None or step <= hi) for lo, hi in ranges)


# How torch.compile'd code runs while recording (docs/phases.md#torchcompile): "compiled", as
# it would untraced (compiled regions recorded as ranges, what they dispatch inside them), or
# "eager": Dynamo skips every frame, the program runs op by op, every op recorded.
COMPILED = ("compiled", "eager")


@dataclass(frozen=True)
class TraceOptions:
    """What :func:`tracer.trace` was asked to record (see its docstring for each option)."""

    steps: Optional[str] = None
    stack_depth: int = 64         # frameworks are user code: Lightning alone takes ~30
    library_frames: bool = False
    record_shapes: bool = True
    record_stacks: bool = True
    record_modules: bool = True
    user_paths: tuple = ()
    library: tuple = ()          # library specs (tracer.vocab.library): "accelerate", "-torch"...
    clock_sync: bool = True
    clock_timeout: float = 20.0
    flush_interval: float = 0.25
    auto_step: bool = True
    device_time: bool = True
    compiled: str = "compiled"
    memory: bool = True          # storages' live bytes per category (recorder/memory/)

    def __post_init__(self):
        parse_steps(self.steps)          # a bad selection fails here, before recording starts
        if self.compiled not in COMPILED:
            raise ValueError(f"compiled={self.compiled!r}: use one of {', '.join(COMPILED)}")
        if self.steps is not None:
            object.__setattr__(self, "steps", str(self.steps))
        object.__setattr__(self, "user_paths", tuple(self.user_paths))
        if isinstance(self.library, str):
            object.__setattr__(self, "library", (self.library,))
        object.__setattr__(self, "library", tuple(self.library))
        parse_specs(self.library)        # a malformed spec fails here too

    def in_window(self) -> Optional[Callable[[int], bool]]:
        """Predicate on the step index; None: every step is recorded."""
        return parse_steps(self.steps)

    def meta(self) -> dict:
        """The ``options`` object of the trace's metadata (docs/trace-format.md)."""
        return dict(steps=self.steps, stack_depth=self.stack_depth,
                    library_frames=self.library_frames, record_shapes=self.record_shapes,
                    record_stacks=self.record_stacks, record_modules=self.record_modules,
                    device_time=self.device_time, compiled=self.compiled,
                    library=list(self.library), memory=bool(self.memory))
