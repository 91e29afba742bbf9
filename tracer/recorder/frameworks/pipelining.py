"""torch.distributed.pipelining under the recorder: passes, micro-batches and P2P phases from the
schedule itself, not guessed from the op stream (docs/phases.md, "torch.distributed.pipelining").

While a trace records, tracer/recorder/patches/distributed.py wraps these with the functions below,
and puts them back when the trace ends (when torch.distributed.pipelining is imported, if it is not
yet: the recorder does not import it, that costs seconds):

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
from time import perf_counter_ns as _now

from tracer.vocab.labels import PHASE_BACKWARD, PHASE_FORWARD, PHASE_OTHER

_PHASE = "_paratrace_phase"          # attribute a P2POp carries: the phase of its message
# a stage's methods that build the P2POps of a pass, and the phase of their messages
MESSAGE_PHASES = (("get_fwd_send_ops", PHASE_FORWARD), ("get_fwd_recv_ops", PHASE_FORWARD),
                  ("get_bwd_send_ops", PHASE_BACKWARD), ("get_bwd_recv_ops", PHASE_BACKWARD))
REDUCE_GRAD_LABEL = "pipelining.reduce_grad"
# schedule class -> the name viz.analysis.timeline.metrics.theoretical_bubble knows (zb-h1: one
# stage per rank)
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


def step_attrs(schedule, args, kwargs) -> dict:
    """The range of a schedule's ``step``."""
    return schedule_attrs(schedule)


def setup(annotations, original):
    """``original`` in the setup phase (``other``): the first step's stage initialization."""
    return annotations.forcing(PHASE_OTHER, original)


# ---------------------------------------------------------------------------- ranges
def ranged(session, label: str, attrs_of, original):
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


def forward_attrs(stage, args, kwargs):
    return _pass_attrs(stage, _arg(args, kwargs, 0, "fwd_chunk_id"))


def backward_attrs(stage, args, kwargs):
    if not getattr(stage, "has_backward", True):
        return None                      # eval(): backward_one_chunk returns at once
    attrs = _pass_attrs(stage, _arg(args, kwargs, 0, "bwd_chunk_id"))
    if not _arg(args, kwargs, 2, "full_backward", True):
        attrs["input_only"] = True       # zero bubble's I: the weights come in a W
    return attrs


def weight_attrs(stage, args, kwargs):
    if not getattr(stage, "has_backward", True):
        return None
    return _pass_attrs(stage, _arg(args, kwargs, 0, "bwd_chunk_id"))


def reduce_grad_attrs(stage, args, kwargs):
    """The range of a stage's gradient reduction or scaling: ``grad_sync``."""
    return {"phase": "grad_sync", "stage": int(stage.stage_index)}


def loss_attrs(schedule, args, kwargs):
    stage = _arg(args, kwargs, 0, "stage")
    if stage is None or not stage.is_last or getattr(schedule, "_loss_fn", None) is None:
        return None
    return dict(_pass_attrs(stage, _arg(args, kwargs, 3, "mb_index")), loss=True)


# ---------------------------------------------------------------------------- P2P
def marking(phase: int, original):
    """A ``get_*_ops`` whose P2POps carry ``phase``."""
    @functools.wraps(original)
    def method(self, *args, **kwargs):
        ops = original(self, *args, **kwargs)
        for op in ops or ():
            setattr(op, _PHASE, phase)
        return ops
    return method


def phased_batch(annotations, original):
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
