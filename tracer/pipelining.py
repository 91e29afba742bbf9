"""torch.distributed.pipelining under the recorder: passes, micro-batches and P2P phases from the
schedule itself, not guessed from the op stream (docs/phases.md, "torch.distributed.pipelining").

While a trace records, :func:`install` wraps, and its undo restores (when torch.distributed.pipelining
is imported, if it is not yet: the recorder does not import it, that costs seconds):

- the stages' ``forward_one_chunk`` / ``backward_one_chunk`` / ``backward_weight_one_chunk``
  in annotation ranges ``F`` / ``B`` / ``W`` with ``microbatch`` (the chunk id the schedule
  passes), ``stage`` (the global stage index) and ``source="pipelining"``; a backward of the
  inputs only (zero-bubble's I) is a ``B`` with ``input_only``;
- the schedule's ``_maybe_compute_loss`` on the last stage in an ``F`` range with ``loss``:
  the loss belongs to the forward pass of its micro-batch (viz merges the two);
- the schedules' ``step`` in a range ``pipelining.step`` whose attributes name the schedule
  (``schedule``, ``schedule_class``, ``pp``, ``stages``, ``microbatches``, ``virtual_stages``,
  ``backward``): the report's theoretical bubble comes from them;
- ``get_fwd_*_ops`` / ``get_bwd_*_ops``: each P2POp they build carries its phase (activations
  forward, gradients backward) and the schedules' ``_batch_p2p`` runs each op under it, also in
  a batch that fuses an activation send with a gradient recv (1F1B's steady state);
- ``perform_reduce_grad`` and ``scale_grads`` (the schedule's gradient scaling by 1/m after the
  last backward, and FSDP's deferred reductions): ``grad_sync``;
- the first step's stage initialization (P2P warm-up, shape inference): ``other`` (setup).

Nothing here runs per op: each wrapper runs once per pass, per P2P batch or per step.
"""
from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import sys
from time import perf_counter_ns as _now

from .labels import PHASE_BACKWARD, PHASE_FORWARD, PHASE_OTHER, SCHEDULE_LABEL
from .patches import Patches

_PHASE = "_paratrace_phase"          # attribute a P2POp carries: the phase of its message
# schedule class -> the name viz.metrics.theoretical_bubble knows (zb-h1: one stage per rank)
_SCHEDULES = {"ScheduleGPipe": "gpipe", "Schedule1F1B": "1f1b",
              "ScheduleInterleaved1F1B": "interleaved", "ScheduleLoopedBFS": "looped-bfs",
              "ScheduleZBVZeroBubble": "zb-v", "ScheduleDualPipeV": "dualpipe-v"}


def schedule_attrs(schedule) -> dict:
    """What a schedule's ``pipelining.step`` range says of it."""
    stages = list(getattr(schedule, "_stages", None) or [schedule._stage])
    pp = int(stages[0].group_size)
    total = int(stages[0].num_stages)
    v = max(total // max(pp, 1), 1)
    cls = type(schedule).__name__
    name = _SCHEDULES.get(cls)
    if cls == "ScheduleInterleavedZeroBubble":
        name = "zb-h1" if v == 1 else "interleaved-zb"
    return {"schedule": name or cls.lower(), "schedule_class": cls, "pp": pp, "stages": total,
            "microbatches": int(schedule._n_microbatches), "virtual_stages": v,
            "backward": bool(getattr(schedule, "_has_backward", True))}


_SCHEDULES_MODULE = "torch.distributed.pipelining.schedules"


def install(session, annotations):
    """Patch torch.distributed.pipelining now if it is imported, else as soon as it is;
    returns the undo."""
    patches = Patches()
    if _SCHEDULES_MODULE in sys.modules:
        _install(patches, session, annotations)
        return patches.undo
    finder = _OnImport(_SCHEDULES_MODULE, lambda: _install(patches, session, annotations))
    sys.meta_path.insert(0, finder)

    def undo():
        if finder in sys.meta_path:
            sys.meta_path.remove(finder)
        patches.undo()
    return undo


class _OnImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Runs ``then`` once module ``name`` has been executed (imported while recording)."""

    def __init__(self, name: str, then):
        self._name, self._then, self._loader = name, then, None

    def find_spec(self, name, path, target=None):
        if name != self._name or self._loader is not None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        self._loader, spec.loader = spec.loader, self
        return spec

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        self._then()


def _install(patches: "Patches", session, annotations) -> None:
    stage_mod = sys.modules.get("torch.distributed.pipelining.stage")
    sched_mod = sys.modules.get(_SCHEDULES_MODULE)
    base = getattr(stage_mod, "_PipelineStageBase", None)
    if base is None or sched_mod is None:   # another torch: its labels still name passes
        return

    def ranged(label: str, attrs_of):
        return functools.partial(_ranged, session, label, attrs_of)
    patches.wrap(base, "forward_one_chunk", ranged("F", _forward_attrs))
    patches.wrap(base, "backward_one_chunk", ranged("B", _backward_attrs))
    patches.wrap(base, "backward_weight_one_chunk", ranged("W", _weight_attrs))
    grad_sync = ranged("pipelining.reduce_grad", lambda stage, a, k: {
        "phase": "grad_sync", "stage": int(stage.stage_index)})
    patches.wrap(base, "perform_reduce_grad", grad_sync)
    patches.wrap(base, "scale_grads", grad_sync)
    for name, phase in (("get_fwd_send_ops", PHASE_FORWARD), ("get_fwd_recv_ops", PHASE_FORWARD),
                        ("get_bwd_send_ops", PHASE_BACKWARD),
                        ("get_bwd_recv_ops", PHASE_BACKWARD)):
        patches.wrap(base, name, functools.partial(_marking, phase))
    schedule = getattr(sched_mod, "_PipelineSchedule", None)
    if schedule is not None:
        patches.wrap(schedule, "_maybe_compute_loss", ranged("F", _loss_attrs))
        patches.wrap(schedule, "_initialize_pp_stages",
                     functools.partial(annotations.forcing, PHASE_OTHER))
    for name in ("PipelineScheduleSingle", "PipelineScheduleMulti"):
        patches.wrap(getattr(sched_mod, name, None), "step",
                     ranged(SCHEDULE_LABEL, lambda s, a, k: schedule_attrs(s)))
    patches.wrap(sched_mod, "_batch_p2p", functools.partial(_phased_batch, annotations))


# ---------------------------------------------------------------------------- ranges
def _ranged(session, label: str, attrs_of, original):
    """``original`` (a method) inside a recorded range ``label`` with ``attrs_of(self, args,
    kwargs)`` (no range when that is None)."""
    @functools.wraps(original)
    def method(self, *args, **kwargs):
        attrs = attrs_of(self, args, kwargs)
        if attrs is None:
            return original(self, *args, **kwargs)
        t0 = _now()
        entry = session.open_range(label, attrs)
        try:
            return original(self, *args, **kwargs)
        finally:
            session.close_range(entry, t0)
    return method


def _arg(args, kwargs, i: int, name: str, default=None):
    """Argument ``name`` of a call (its ``i``-th positional after self)."""
    return args[i] if len(args) > i else kwargs.get(name, default)


def _pass_attrs(stage, microbatch) -> dict:
    return {"microbatch": int(microbatch), "stage": int(stage.stage_index),
            "source": "pipelining"}


def _forward_attrs(stage, args, kwargs):
    return _pass_attrs(stage, _arg(args, kwargs, 0, "fwd_chunk_id"))


def _backward_attrs(stage, args, kwargs):
    if not getattr(stage, "has_backward", True):
        return None                      # eval(): backward_one_chunk returns at once
    attrs = _pass_attrs(stage, _arg(args, kwargs, 0, "bwd_chunk_id"))
    if not _arg(args, kwargs, 2, "full_backward", True):
        attrs["input_only"] = True       # zero bubble's I: the weights come in a W
    return attrs


def _weight_attrs(stage, args, kwargs):
    if not getattr(stage, "has_backward", True):
        return None
    return _pass_attrs(stage, _arg(args, kwargs, 0, "bwd_chunk_id"))


def _loss_attrs(schedule, args, kwargs):
    stage = _arg(args, kwargs, 0, "stage")
    if stage is None or not stage.is_last or getattr(schedule, "_loss_fn", None) is None:
        return None
    return dict(_pass_attrs(stage, _arg(args, kwargs, 3, "mb_index")), loss=True)


# ---------------------------------------------------------------------------- P2P
def _marking(phase: int, original):
    """A ``get_*_ops`` whose P2POps carry ``phase``."""
    @functools.wraps(original)
    def method(self, *args, **kwargs):
        ops = original(self, *args, **kwargs)
        for op in ops or ():
            setattr(op, _PHASE, phase)
        return ops
    return method


def _phased_batch(annotations, original):
    """The schedules' ``_batch_p2p(p2p_ops, desc)`` running each op under its phase."""
    @functools.wraps(original)
    def batch(p2p_ops, *args, **kwargs):
        phases = {getattr(op, _PHASE, None) for op in p2p_ops}
        if len(phases) <= 1:
            phase = phases.pop() if phases else None
            return _under(annotations, phase, original, p2p_ops, *args, **kwargs)
        if len({op.op for op in p2p_ops}) == 1:
            # all sends (or all recvs): _batch_p2p runs them one by one anyway
            return [work for op in p2p_ops for work in _under(
                annotations, getattr(op, _PHASE, None), original, [op], *args, **kwargs)]
        # sends and recvs fused in one batch_isend_irecv (needed to avoid deadlocks): each op
        # runs under its phase through a stand-in for isend / irecv, put back afterwards
        saved = [op.op for op in p2p_ops]
        try:
            for op in p2p_ops:
                op.op = _phased_op(annotations, getattr(op, _PHASE, None), op.op)
            return original(p2p_ops, *args, **kwargs)
        finally:
            for op, fn in zip(p2p_ops, saved):
                op.op = fn
    return batch


def _under(annotations, phase, fn, *args, **kwargs):
    if phase is None:
        return fn(*args, **kwargs)
    with annotations.forced(phase):
        return fn(*args, **kwargs)


def _phased_op(annotations, phase, fn):
    """``fn`` (dist.isend or dist.irecv) under ``phase``. batch_isend_irecv names the peer
    ``group_dst`` only for dist.isend itself: the stand-in takes either name."""
    import torch.distributed as dist
    key = "group_dst" if fn is dist.isend else "group_src"

    def call(tensor, *args, **kwargs):
        for other in ("group_dst", "group_src"):
            if other != key and other in kwargs:
                kwargs[key] = kwargs.pop(other)
        return _under(annotations, phase, fn, tensor, *args, **kwargs)
    return call
