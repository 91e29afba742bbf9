"""DTensor under the recorder: the local ops and collectives below each DTensor op.

A TorchDispatchMode runs before tensor subclasses: it sees ``aten.mm`` on DTensors (global
shapes) and, left alone, DTensor then runs its sharding propagation, redistributions and local
ops with the mode off the stack, unseen. Here a DTensor op becomes an annotation range, labelled
with the op's name (``aten.mm.default``) and attributes ``{"source": "dtensor", "mesh",
"mesh_dims", "placements", "shapes"}`` (the DTensor arguments' placements and global shapes), and
the op runs again with the mode on the stack and a flag that makes the mode answer
NotImplemented for that one call (what torch's CommDebugMode does): DTensor's own dispatch (the
C++ fast path included) then runs under the mode, so its local ops (local shapes) and its
functional collectives (redistributions: group, bytes, completion through wait_tensor) are
recorded as ordinary ops inside the range, with the phase they would have as plain ops. Nothing
here runs for plain tensors: the mode only calls :class:`SubclassOps` when ``types`` is not
empty.

While a DTensor op runs, ops dispatched under a FakeTensorMode (its sharding propagation on a
cache miss) are run but not recorded: they compute nothing.

Outside modules, a DTensor op autograd records is ``forward`` and its local ops and
collectives with it (they make no autograd node of their own).

Also :func:`function_phase`: a collective in the forward of a custom autograd Function outside
modules (``DTensor.full_tensor()``'s all-gather in a loss computation: autograd runs forward
with grad mode off) is ``forward`` when the Function takes part in autograd.
"""
from __future__ import annotations

import sys
from time import perf_counter_ns as _now

import torch

from tracer.vocab.labels import PHASE_FORWARD

from ..compat import function_application

_get_mode = torch._C._get_dispatch_mode
_FAKE = torch._C._TorchDispatchModeKey.FAKE
_push = torch._C._push_on_torch_dispatch_stack
_pop = torch._C._pop_torch_dispatch_stack


def _dtensor_class():
    """DTensor, or None while torch.distributed.tensor is not imported (then none exists)."""
    module = sys.modules.get("torch.distributed.tensor._api")
    return getattr(module, "DTensor", None)


class SubclassOps:
    """The mode's handler of ops whose arguments include tensor subclasses."""

    def __init__(self, session, mode):
        self._session = session
        self._mode = mode
        self._on_op = mode._on_op          # the session's hot path
        self._let = None                   # the op re-dispatched to DTensor: answer NotImplemented
        self._passed = None                # ... and answered so, while DTensor's dispatch runs
        self._depth = 0                    # DTensor ops running
        self._meshes: dict = {}            # id(mesh) -> (mesh, ranks as nested lists, dim names)
        self._dtensor = None

    def __call__(self, func, types, args, kwargs):
        dtensor = self._dtensor or self._find_dtensor(types)
        if dtensor is None or not any(issubclass(t, dtensor) for t in types):
            # NOTE: under a FakeTensorMode nothing runs: DTensor's sharding propagation,
            # torch.export's tracing (pipeline()); recording it would read symbolic sizes, and
            # guard on them (export then fails: "Constraints violated")
            if _get_mode(_FAKE) is not None:
                return func(*args, **kwargs)
            return self._on_op(func, args, kwargs)
        # NOTE: only DTensor ops are let through (sharding propagation may run the same op on
        # fake tensors meanwhile, which the recorder itself runs)
        if self._let is func:
            self._let = None
            self._passed = func
            return NotImplemented          # DTensor's dispatch runs now, under the mode
        if self._passed is func:
            # NOTE: torch 2.6 and 2.7 offer a mode's NotImplemented to the mode below it first,
            # here this same mode again (pushed by the op above): pass it on to DTensor too
            return NotImplemented
        session = self._session
        if session.passthrough:
            return func(*args, **kwargs)
        entry = session.open_range(str(func), self._attrs(dtensor, args))
        forced = self._recorded_forward(session, dtensor, args)
        t0 = _now()
        self._depth += 1
        if self._depth == 1:
            self._mode._on_op = self._local_op
        self._let = func
        _push(self._mode)
        try:
            return func(*args, **kwargs)
        finally:
            _pop(None)
            self._let = self._passed = None
            self._depth -= 1
            if self._depth == 0:
                self._mode._on_op = self._on_op
            if forced is not None:
                session.annotations.pop(forced)
            session.close_range(entry, t0)

    @staticmethod
    def _recorded_forward(session, dtensor, args):
        """Outside modules, the autograd engine, optimizer steps and annotations naming a
        phase, a DTensor op autograd records (grad mode on, a DTensor argument needing a
        gradient: ``loss = (a @ b).sum()``) is forward, as the plain op would be: its local ops
        and collectives, which make no autograd node, get that phase through an unrecorded
        range (returned, to pop); None otherwise."""
        if session.modules.current >= 0 or session.annotations.phase_hint is not None or \
                session.in_optimizer or not torch.is_grad_enabled() or \
                torch._C._current_autograd_node() is not None:
            return None
        if not any(isinstance(t, dtensor) and t.requires_grad for a in args
                   for t in (a if isinstance(a, (list, tuple)) else (a,))):
            return None
        return session.annotations.force(PHASE_FORWARD)

    def _find_dtensor(self, types):
        self._dtensor = _dtensor_class()
        return self._dtensor

    def _local_op(self, func, args, kwargs):
        """A plain op inside a DTensor op: recorded unless a FakeTensorMode runs it."""
        if _get_mode(_FAKE) is not None:
            return func(*args, **kwargs)
        return self._on_op(func, args, kwargs)

    def _attrs(self, dtensor, args) -> dict:
        placements, shapes, mesh = [], [], None
        for a in args:
            for t in (a if isinstance(a, (list, tuple)) else (a,)):
                if isinstance(t, dtensor):
                    placements.append([str(p) for p in t.placements])
                    shapes.append(list(t.shape))
                    mesh = t.device_mesh
        attrs = {"source": "dtensor", "placements": placements, "shapes": shapes}
        if mesh is not None:
            known = self._meshes.get(id(mesh))
            if known is None or known[0] is not mesh:
                known = self._meshes[id(mesh)] = (mesh, mesh.mesh.tolist(),
                                                  list(mesh.mesh_dim_names or ()))
            attrs["mesh"], attrs["mesh_dims"] = known[1], known[2]
        return attrs


def function_phase(frame, phase: int) -> int:
    """``forward`` for a collective inside the forward of a custom autograd Function that takes
    part in autograd (some input needs a gradient, with grad mode on where it was applied),
    else ``phase``. Runs once per collective that would be ``other``: walks up to 24 frames."""
    found = function_application(frame, 24)
    callee = found[0] if found is not None else None
    if callee is None or not callee.f_code.co_argcount:
        return phase
    ctx = callee.f_locals.get(callee.f_code.co_varnames[0])
    # NOTE: needs_input_grad ignores grad mode; the node's edges exist only when
    # autograd records the Function (grad mode on, an input needing a gradient)
    edges = getattr(ctx, "next_functions", None) \
        if isinstance(ctx, torch._C._FunctionBase) else None
    return PHASE_FORWARD if edges else phase
