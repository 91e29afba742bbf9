"""Activation checkpointing (non-reentrant) added to or taken from modules, on the recorded
step's working storages (viz.whatif.memory.working_memory.Work).

Checkpointing a module M: what its forward saved for backward (made in its forward, freed in
its backward) is no longer kept: in the forward it lives only until M's forward ends, as a
temporary; the recomputation, just before M's backward, makes it again (freed where the
backward freed it), with the forward's temporaries for an instant. Inside a checkpoint
autograd saves nothing through the recorder's hooks (checkpoint's own hooks take the saved
tensors), so what it keeps stays a temporary, as the recorder counts it
(docs/trace-format.md, "Memory"). What M's forward saved
that outlives its backward (its output, saved by the module after it) and its input (the
checkpoint saves it) stay as they were: memory drops by what M's forward saved, less its
input. Taking checkpointing off M: the recomputation's storages are made in M's forward
instead, at the place of the forward op the recomputed one repeats, and the forward's
temporaries they replace are dropped.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from tracer.vocab.model_paths import model_path

from ..recorded.windows import BACKWARD, FORWARD, RECOMPUTE, StepWindows

RECOMPUTED = -2          # the recomputation's place: before M's backward's first op


def recheckpoint(works: list, recorded: tuple, target: tuple, windows: StepWindows,
                 ops) -> list:
    """``works`` with checkpointing moved from ``recorded`` to ``target`` modules."""
    for module in target:
        if module not in recorded:
            works = _checkpoint(works, module, windows)
    for module in recorded:
        if module not in target:
            works = _uncheckpoint(works, module, windows, ops)
    return works


def _inside(t, run) -> bool:
    return t is not None and run[0] <= t <= run[1]


def _checkpoint(works: list, module: str, windows: StepWindows) -> list:
    forwards = windows.of(FORWARD, module)
    backwards = windows.of(BACKWARD, module)
    out = []
    for w in works:
        fwd = next((r for r in forwards if _inside(w.start, r)), None)
        after = next((r for r in backwards if fwd is not None and r[0] > fwd[1]), None)
        if fwd is None or after is None:
            out.append(w)
            continue
        again = replace(w, category="temporaries", start=after[0],
                        born_order=replayed(w.start, fwd))
        if _inside(w.end, after):        # saved for M's backward: made again before it
            out.append(replace(w, category="temporaries", end=fwd[1]))
            out.append(again)
        elif w.end is not None and w.end <= fwd[1]:
            out.append(w)                # a transient of the forward, and of the replay
            out.append(replace(again, end=after[0], freed_order=replayed(w.end, fwd)))
        else:
            out.append(w)
    return out


def replayed(t: int, forward: tuple) -> float:
    """The order, among what happens at the start of M's backward, of what the replay does
    at recorded time ``t`` of M's forward: the forward's own order, before the backward's."""
    return RECOMPUTED + (t - forward[0]) / (forward[1] - forward[0] + 1)


def _uncheckpoint(works: list, module: str, windows: StepWindows, ops) -> list:
    forwards = windows.of(FORWARD, module)
    recomputes = windows.of(RECOMPUTE, module)
    out = []
    for w in works:
        if any(_inside(w.start, r) and w.end is not None and w.end <= r[1] for r in forwards):
            continue                     # the checkpointed forward's own temporaries
        run = next((r for r in recomputes if _inside(w.start, r)), None)
        if run is None:
            out.append(w)
            continue
        fwd = [r for r in forwards if r[1] < run[0]]
        if not fwd:
            out.append(w)
            continue
        at = _same_op(ops, module, run, fwd[-1], w.start)
        if w.end is None or w.end > run[1]:      # kept for the backward: saved by autograd
            out.append(replace(w, start=at, born_order=0, category="activations"))
        else:                                    # a transient of the forward
            out.append(replace(w, start=at, end=min(at + w.end - w.start, fwd[-1][1])))
    return out


def _same_op(ops, module: str, recompute: tuple, forward: tuple, t: int) -> int:
    """The start of the forward op that the recomputed op starting at ``t`` repeats (the
    k-th op of the module's recomputation is the k-th of its forward)."""
    def rows(run, phase):
        inside = np.nonzero((ops.t0 >= run[0]) & (ops.t0 <= run[1]) & (ops.phase == phase))[0]
        return [i for i in inside.tolist() if ops.module[i] >= 0 and
                (model_path(ops.modules[ops.module[i]]) + ".").startswith(
                    module + "." if module else "")]
    again, first = rows(recompute, RECOMPUTE), rows(forward, FORWARD)
    k = int(np.searchsorted(ops.t0[again], t, side="right")) - 1 if again else 0
    if not first:
        return forward[0]
    return int(ops.t0[first[min(max(k, 0), len(first) - 1)]])
