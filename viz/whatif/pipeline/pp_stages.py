"""A recorded model cut into pipeline stages at module boundaries (``--split``), as torchtitan
cuts its models for torch.distributed.pipelining: the model's *top-level sequence* (the root's
children in the order the forward ran them, a ModuleList's or ModuleDict's items in place of
the container) is cut before each module a PATTERN names; stage i runs the items from its cut
to the next, the ops the root runs between them (a pooling before the head) with the items
after them.

On the recorded step (viz.whatif.recorded.windows), each stage's forward and backward of a
micro-batch are windows of time: the forward from its first item's first op to the next stage's,
the backward from the end of the next stage's first item's backward (the gradient it hands back) to
the end of its own first item's. What crosses a cut is one activation: the first input of the next
stage's first op (its recorded shape), and its gradient back.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np

from tracer.vocab.model_paths import matches, model_path

from ...analysis.callgraphs.flops import parse_shapes
from ..recorded.layout import DTYPE_BYTES, Layout
from ..recorded.windows import BACKWARD, FORWARD, Micro, StepWindows
from ..reference_gpt.targets import TargetError

DTYPES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16", "f64": "float64",
          "i64": "int64", "i32": "int32", "i16": "int16", "i8": "int8", "u8": "uint8",
          "c64": "complex64", "c128": "complex128", "b8": "bool"}


@dataclass(frozen=True)
class StageCut:
    """The stages of a split: each stage's top-level items (module paths), in order."""

    stages: tuple                     # tuple of tuples of paths

    def __len__(self) -> int:
        return len(self.stages)

    def stage_of(self, module: Optional[str]) -> Optional[int]:
        """The stage whose items hold ``module`` (a path on the unwrapped model); None for
        the root and modules outside every item."""
        if not module:
            return None
        for i, items in enumerate(self.stages):
            if any(module == p or module.startswith(p + ".") for p in items):
                return i
        return None

    def firsts(self) -> list:
        return [items[0] for items in self.stages]


def top_level(windows: StepWindows, layout: Layout, modules: list) -> list:
    """The model's top-level sequence in the order the recorded forward ran it: the root's
    children, the items of a container (its children named 0, 1, ...) in place of it."""
    blocks = layout.repeated_blocks()
    containers = {b.rpartition(".")[0] for b in blocks if "." in b and
                  "." not in b.rpartition(".")[0]}
    items = [m for m in modules if m and "." not in m and m not in containers]
    items += [b for b in blocks if b.rpartition(".")[0] in containers]
    started = []
    for path in items:
        runs = windows.of(FORWARD, path)
        if runs:
            started.append((runs[0][0], path))
    return [p for _, p in sorted(started)]


def cut(patterns: str, sequence: list, modules: list, pp: int) -> StageCut:
    """The stages ``patterns`` (comma-separated PATTERNs, each naming where a stage begins)
    make of ``sequence``; TargetError for a PATTERN matching no module, a module that is not
    an item of the top-level sequence, a cut before the first item, or a stage count ``pp``
    does not divide."""
    starts = []
    for pattern in [p.strip() for p in str(patterns).split(",") if p.strip()]:
        hits = [m for m in modules if m and matches(pattern, m)]
        if not hits:
            raise TargetError(f"--split {pattern!r} matches no module of the model (its "
                              f"top-level sequence: {_sample(sequence)})")
        for module in hits:
            if module not in sequence:
                raise TargetError(f"--split: {module} is not an item of the model's top-level "
                                  "sequence, where the model can be cut (before one of: "
                                  f"{_sample(sequence[1:])})")
            if module == sequence[0]:
                raise TargetError(f"--split: {module} is the model's first module: a stage "
                                  "cut before it would run nothing")
            starts.append(sequence.index(module))
    bounds = [0] + sorted(set(starts)) + [len(sequence)]
    stages = tuple(tuple(sequence[a:b]) for a, b in zip(bounds, bounds[1:]))
    if len(stages) < pp:
        raise TargetError(f"--pp {pp} is more than the {len(stages)} stages --split makes "
                          f"(name {pp - 1} modules in --split for --pp {pp})")
    if len(stages) % pp:
        raise TargetError(f"--split makes {len(stages)} stages ({len(stages) - 1} cuts), not a "
                          f"multiple of --pp {pp} (name one cut fewer than the stages: "
                          f"--split with {pp - 1} modules for --pp {pp})")
    return StageCut(stages)


def _sample(paths: list) -> str:
    return ", ".join(paths[:8]) + (", ..." if len(paths) > 8 else "")


@dataclass(frozen=True)
class StageWindows:
    """Where each stage's forward and backward of one recorded micro-batch ran: [lo, hi)."""

    forward: tuple                    # per stage (lo, hi)
    backward: tuple

    def stage_at(self, t: int) -> Optional[tuple]:
        """(stage, "F" | "B") of the window holding recorded time ``t``; None: outside."""
        for kind, spans in (("F", self.forward), ("B", self.backward)):
            for i, (lo, hi) in enumerate(spans):
                if lo <= t < hi:
                    return i, kind
        return None


def stage_windows(windows: StepWindows, micro: Micro, stages: StageCut) -> StageWindows:
    """The stage windows of micro-batch ``micro`` of a recorded step."""
    n = len(stages)
    bounds = (micro.forward[0], micro.backward[0])
    starts = [micro.forward[0]] + [_first(windows, FORWARD, p, bounds)[0]
                                   for p in stages.firsts()[1:]]
    forward = tuple((starts[i], starts[i + 1] if i + 1 < n else micro.forward[1] + 1)
                    for i in range(n))
    back = (micro.backward[0], micro.backward[1])
    ends = [_first(windows, BACKWARD, p, back)[1] + 1 for p in stages.firsts()[1:]]
    backward = tuple(((ends[i] if i < n - 1 else micro.backward[0]),
                      (ends[i - 1] if i > 0 else micro.autograd_end + 1)) for i in range(n))
    return StageWindows(forward, backward)


def _first(windows: StepWindows, phase: int, module: str, bounds: tuple) -> tuple:
    """(start, end) of ``module``'s runs in ``phase`` within ``bounds``."""
    runs = [r for r in windows.of(phase, module) if bounds[0] <= r[0] <= bounds[1]]
    if not runs:
        raise TargetError(f"--split: {module} did not run its "
                          f"{'forward' if phase == FORWARD else 'backward'} in the recorded "
                          "micro-batch")
    return runs[0][0], runs[-1][1]


def boundary_bytes(ops, step: int, spans: StageWindows, stages: StageCut) -> list:
    """Per cut, the bytes of the activation it hands on (and of its gradient back): the first
    tensor input of the next stage's first op, from its recorded shape."""
    mine = ops.step == step
    out = []
    for i, path in enumerate(stages.firsts()[1:], start=1):
        lo, hi = spans.forward[i]
        rows = np.nonzero(mine & (ops.t0 >= lo) & (ops.t0 < hi) &
                          (ops.phase == FORWARD))[0]
        found = None
        for r in rows.tolist():
            code = int(ops.module[r])
            if code < 0 or not (model_path(ops.modules[code]) + ".").startswith(path + "."):
                continue
            found = _tensor_bytes(ops.shape_texts[ops.shapes[r]]) if ops.shapes[r] >= 0 \
                else None
            if found:
                break
        if not found:
            raise TargetError(f"--split: no recorded input shape for {path}'s first op (the "
                              "activation a stage hands on is read from it)")
        out.append(found)
    return out


def _tensor_bytes(text: str) -> Optional[int]:
    """Bytes of the first tensor in a recorded shapes text (``f32[4,32,128] ...``)."""
    args = parse_shapes(text)
    words = text.split()
    for arg, word in zip(args, words):
        if isinstance(arg, tuple):
            dtype = DTYPES.get(word.split("[")[0])
            size = DTYPE_BYTES.get(dtype) if dtype else None
            return math.prod(arg) * size if size else None
    return None
