"""The annotation vocabulary, shared by the recorder and viz: phases, and the labels that name
pipeline passes.

Phases (the trace's ``phase`` column holds the index into :data:`PHASES`): which part of the
training step issued an op (docs/phases.md). Labels: ``tracer.annotate("F", microbatch=3,
chunk=1)`` (also "B", "W") names a pass of a micro-batch through a model chunk;
torch.distributed.pipelining's record_function ranges name them too, as
``PP:<stage><action><microbatch>`` (schedules run from an action list: PP:0F1, PP:1I0, PP:0SEND_F2)
or ``Forward <i>`` / ``Backward <i>`` (GPipe); tracer.recorder.frameworks.pipelining's ranges name
every schedule's passes from its stages' own calls (``F``/``B``/``W`` with ``source="pipelining"``)
and the schedule of each step (``pipelining.step``). Torch-free: viz reads traces without torch.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Optional

from .strenum import StrEnum


class Phase(StrEnum):
    """Which part of the training step issued an op (docs/phases.md)."""

    OTHER = "other"
    FORWARD = "forward"
    BACKWARD = "backward"
    RECOMPUTE = "recompute"
    GRAD_SYNC = "grad_sync"
    OPTIMIZER = "optimizer"


# NOTE: codes are stored in traces: append new phases, never renumber (0-2 predate the others)
PHASES: tuple[Phase, ...] = tuple(Phase)
PHASE_OTHER, PHASE_FORWARD, PHASE_BACKWARD = 0, 1, 2
PHASE_RECOMPUTE, PHASE_GRAD_SYNC, PHASE_OPTIMIZER = 3, 4, 5
PHASE_CODES: dict[str, int] = {name: code for code, name in enumerate(PHASES)}

PASS_KINDS = ("F", "B", "W")


class PassSource(StrEnum):
    """What named a pipeline pass."""

    ANNOTATION = "annotation"            # tracer.annotate("F", ...)
    RECORD_FUNCTION = "record_function"  # torch.distributed.pipelining's labels
    SCHEDULE = "schedule"                # tracer.recorder.frameworks.pipelining's ranges
    INFERRED = "inferred"                # nothing: viz inferred it from the P2P order

# Labels that set the phase of the ops inside them.
_PHASE_OF_LABEL = {"F": PHASE_FORWARD, "forward": PHASE_FORWARD, "B": PHASE_BACKWARD,
                   "W": PHASE_BACKWARD, "backward": PHASE_BACKWARD, "recompute": PHASE_RECOMPUTE,
                   "grad_sync": PHASE_GRAD_SYNC, "grad-sync": PHASE_GRAD_SYNC,
                   "optimizer": PHASE_OPTIMIZER, "other": PHASE_OTHER}
# FSDP2's record_function ranges around its gradient reductions (named "<prefix> (<index>)");
# in the reshard, the gradients of parameters that are DTensors on another mesh dimension too
# (FSDP2 + TP with sequence parallelism: the norms' Partial gradients) are all-reduced over it
_PHASE_OF_PREFIX = (("FSDP::post_backward_reduce", PHASE_GRAD_SYNC),
                    ("FSDP::post_backward_rs_wait", PHASE_GRAD_SYNC),
                    ("FSDP::post_backward_reshard", PHASE_GRAD_SYNC))

_PIPELINING_ACTION = re.compile(r"^PP:(\d+)([A-Z_]+?)(\d*)$")
_PIPELINING_GPIPE = re.compile(r"^(Forward|Backward) (\d+)$")
# pipelining action -> (phase, pass kind or None for communication actions)
_ACTIONS = {"F": (PHASE_FORWARD, "F"), "Forward": (PHASE_FORWARD, "F"),
            "SEND_F": (PHASE_FORWARD, None), "RECV_F": (PHASE_FORWARD, None),
            "B": (PHASE_BACKWARD, "B"), "I": (PHASE_BACKWARD, "B"), "Backward": (PHASE_BACKWARD, "B"),
            "W": (PHASE_BACKWARD, "W"), "SEND_B": (PHASE_BACKWARD, None),
            "RECV_B": (PHASE_BACKWARD, None), "REDUCE_GRAD": (PHASE_GRAD_SYNC, None)}
# recorder.frameworks.pipelining's range around a schedule's step(), and the attributes viz
# reads from it
SCHEDULE_LABEL = "pipelining.step"
SCHEDULE_KEYS = ("schedule", "pp", "microbatches", "virtual_stages")


@dataclass(frozen=True)
class PassLabel:
    """What a label says of a pipeline pass."""

    kind: str                    # "F" | "B" | "W"
    microbatch: Optional[int]
    chunk: int                   # annotations: the rank's model chunk; pipelining: the stage
    source: PassSource           # never INFERRED: a label names the pass
    loss: bool = False           # the loss after a forward: the end of that forward pass


def _pipelining(label: str) -> Optional[tuple[str, int, int]]:
    """(action, stage, microbatch) of a torch.distributed.pipelining label, or None."""
    match = _PIPELINING_ACTION.match(label)
    if match:
        return match.group(2), int(match.group(1)), int(match.group(3) or -1)
    match = _PIPELINING_GPIPE.match(label)
    if match:
        return match.group(1), 0, int(match.group(2))
    return None


def phase_of_label(label: str) -> Optional[int]:
    """The phase code an annotation label implies, or None."""
    phase = _PHASE_OF_LABEL.get(label)
    if phase is None and label.startswith("FSDP::"):
        phase = next((p for prefix, p in _PHASE_OF_PREFIX if label.startswith(prefix)), None)
    if phase is None and label.startswith("Optimizer."):   # torch.optim's step, zero_grad
        phase = PHASE_OPTIMIZER
    if phase is None:
        found = _pipelining(label)
        if found is not None and found[0] in _ACTIONS:
            phase = _ACTIONS[found[0]][0]
    return phase


def phase_of_attrs(label: str, attrs: dict[str, Any]) -> Optional[int]:
    """An explicit ``phase=`` attribute wins over what the label implies."""
    if "phase" in attrs:
        phase = attrs["phase"]
        return PHASE_CODES.get(phase) if isinstance(phase, str) else None
    return phase_of_label(label)


def pass_of(label: str, attrs: dict[str, Any]) -> Optional[PassLabel]:
    """The pass a label (with its attributes) names, or None."""
    if label in PASS_KINDS:
        mb = attrs.get("microbatch")
        mb = mb if isinstance(mb, int) else None
        if attrs.get("source") == "pipelining":      # recorder.pipelining: chunk is the stage
            return PassLabel(label, mb, int(attrs.get("stage") or 0), PassSource.SCHEDULE,
                             bool(attrs.get("loss")))
        return PassLabel(label, mb, int(attrs.get("chunk") or 0), PassSource.ANNOTATION)
    found = _pipelining(label)
    if found is None or found[0] not in _ACTIONS or found[2] < 0:
        return None
    action, stage, microbatch = found
    kind = _ACTIONS[action][1]
    return None if kind is None else PassLabel(kind, microbatch, stage,
                                                         PassSource.RECORD_FUNCTION)


def schedule_of(label: str, attrs: dict[str, Any]) -> Optional[tuple[Any, ...]]:
    """(schedule, pp, microbatches, virtual_stages) a recorder.frameworks.pipelining step range
    names (what the theoretical bubble needs), or None."""
    if label != SCHEDULE_LABEL or attrs.get("backward") is False:
        return None
    values = tuple(attrs.get(key) for key in SCHEDULE_KEYS)
    if not isinstance(values[0], str) or not all(isinstance(v, int) for v in values[1:]):
        return None
    return values
