"""When each module ran in a recorded step: per micro-batch, the forward and backward of the
whole model, and every module's runs of ops per phase, on the unwrapped model's paths
(tracer.vocab.model_paths), from a rank's step detail (viz.analysis.step_detail). The
transformations anchor what they add or move to these times (viz.whatif.edits.dp_plan,
viz.whatif.memory.memory_replay, viz.whatif.edits.edit).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from tracer.vocab.labels import PHASES
from tracer.vocab.model_paths import model_path

from .layout import ROOT

FORWARD, BACKWARD, RECOMPUTE = PHASES.index("forward"), PHASES.index("backward"), \
    PHASES.index("recompute")
OPTIMIZER, GRAD_SYNC = PHASES.index("optimizer"), PHASES.index("grad_sync")


@dataclass(frozen=True)
class Micro:
    """One micro-batch of a step: its forward and backward (first op start, last op end; the
    backward's gradient synchronisation ops included); ``autograd_end``: the end of its
    backward's last backward or recompute op (where DDP's finalize waits)."""

    forward: tuple
    backward: tuple
    autograd_end: int = 0


@dataclass
class StepWindows:
    """The windows of one step of one rank (ns, rank 0's clock)."""

    step: int
    span: tuple                          # first op start, last op end
    micro: list                          # Micro, in order
    runs: dict = field(default_factory=dict)   # (phase code, module path) -> [(start, end)]
    optimizer: Optional[tuple] = None

    def of(self, phase: int, module: str) -> list:
        """The runs of ``module`` (and the modules inside it) in ``phase``; the root's are
        the micro-batches' forward (backward, recompute: every run of that phase)."""
        if module == ROOT and phase in (FORWARD, BACKWARD):
            return [m.forward if phase == FORWARD else m.backward for m in self.micro]
        return self.runs.get((phase, module), [])

    def modules_span(self, phase: int, bounds: tuple) -> Optional[tuple]:
        """(first start, last end) of the ops inside any module in ``phase`` within
        ``bounds``: the root module's own run (a loss computed outside it left out)."""
        runs = [r for (p, path), rs in self.runs.items() if p == phase and path
                and "." not in path for r in rs if bounds[0] <= r[0] <= bounds[1]]
        if not runs:
            return None
        return min(r[0] for r in runs), max(r[1] for r in runs)



def step_windows(ops, step: int) -> StepWindows:
    """The windows of ``step`` from a rank's StepOps."""
    mine = np.nonzero(ops.step == step)[0]
    t0, t1, phase = ops.t0[mine], ops.t1[mine], ops.phase[mine]
    out = StepWindows(step, (int(t0.min()), int(t1.max())) if len(mine) else (0, 0), [])
    out.micro = _micro(t0, t1, phase)
    paths = {}
    for code in set(ops.module[mine].tolist()):
        if code >= 0:
            paths[code] = model_path(ops.modules[code])
    previous = _previous(phase)
    open_: dict = {}                     # (phase, path) -> [start, end, last index]
    for k, i in enumerate(mine.tolist()):
        code, p = int(ops.module[i]), int(ops.phase[i])
        if code < 0:
            continue
        parts = paths[code].split(".") if paths[code] else []
        for depth in range(1, len(parts) + 1):
            key = (p, ".".join(parts[:depth]))
            run = open_.get(key)
            if run is not None and run[2] == previous[k]:
                run[1], run[2] = int(t1[k]), k
            else:
                if run is not None:
                    out.runs.setdefault(key, []).append((run[0], run[1]))
                open_[key] = [int(t0[k]), int(t1[k]), k]
    for key, run in open_.items():
        out.runs.setdefault(key, []).append((run[0], run[1]))
    out.runs = {key: _merged(runs, out.micro) for key, runs in out.runs.items()}
    opt = np.nonzero(phase == OPTIMIZER)[0]
    if len(opt):
        out.optimizer = (int(t0[opt[0]]), int(t1[opt[-1]]))
    return out


def _merged(runs: list, micro: list) -> list:
    """One run per micro-batch (its first run's start to its last run's end: a module's
    backward is cut by the gradient hooks of other modules), runs outside them as they
    are."""
    out: dict = {}
    for run in sorted(runs):
        i = next((k for k, m in enumerate(micro) if m.forward[0] <= run[0] <= m.backward[1]),
                 None)
        key = ("micro", i) if i is not None else ("run", run)
        lo, hi = out.get(key, run)
        out[key] = (min(lo, run[0]), max(hi, run[1]))
    return sorted(out.values())


def _previous(phase: np.ndarray) -> list:
    """Per op, the index of the op of its phase before it (-1: none): a module's run goes on
    across ops of other phases (a gradient hook's grad_sync op inside a backward)."""
    last: dict = {}
    out = []
    for k, p in enumerate(phase.tolist()):
        out.append(last.get(p, -1))
        last[p] = k
    return out


def _micro(t0: np.ndarray, t1: np.ndarray, phase: np.ndarray) -> list:
    """Each forward run of ops a backward run follows, with that backward run."""
    out = []
    f_lo = f_hi = b_lo = b_hi = grads = None
    for a, b, p in zip(t0.tolist(), t1.tolist(), phase.tolist()):
        if p == FORWARD:
            if b_lo is not None:
                out.append(Micro((f_lo, f_hi), (b_lo, b_hi), grads or b_hi))
                f_lo = b_lo = grads = None
            f_lo = a if f_lo is None else f_lo
            f_hi = b
        elif p in (BACKWARD, RECOMPUTE, GRAD_SYNC) and f_lo is not None:
            b_lo = a if b_lo is None else b_lo
            b_hi = max(b, b_hi or b)
            if p != GRAD_SYNC:
                grads = max(b, grads or b)
    if f_lo is not None and b_lo is not None:
        out.append(Micro((f_lo, f_hi), (b_lo, b_hi), grads or b_hi))
    return out
