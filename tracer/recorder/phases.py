"""Phases the hot path cannot read from one flag: recomputation, gradient synchronisation and
setup (docs/phases.md).

The hot path (op_path.py) decides most phases from what it already reads: the autograd node
running (backward), an optimizer step (optimizer), the innermost annotation naming a phase, the
module stack and grad mode (forward, else other). This module adds, without a cost per op:

- ``recompute``: torch.utils.checkpoint's non-reentrant recomputation runs the checkpointed
  function again inside the backward of the region, under its ``_recomputation_hook``; a
  subclass of that hook counts the recomputations in progress (``Session.recompute``), and a
  subclass of ``_CheckpointFrame`` remembers the module stack of the forward so the recomputed
  ops carry the modules they had in the forward. The reentrant one (``CheckpointFunction``)
  replays the function inside its node's backward: the replay is wrapped to the same effect.
- collectives (decided once per collective, not per op): ``grad_sync`` for one launched from a
  hook of an ``AccumulateGrad`` node (DDP's Reducer, post-accumulate-grad hooks). One outside
  backward, modules and optimizer steps is classed by what it carries: ``grad_sync`` when its
  input shares storage with a parameter's ``.grad`` (or ``.main_grad``): all-reduces of
  gradients after ``loss.backward()``; ``forward`` for an activation autograd records; else
  ``other`` (parameters in setup, buffers, scalars and metrics, barriers), whatever grad mode
  says. FSDP2's reductions come through its record_function labels (tracer.vocab.labels).
  Such a collective, when no annotation names its phase, carries the module that owns the
  parameter whose hook launched it: the DistributedDataParallel wrapper for DDP's bucket
  all-reduces, else the parameter's module.
- ``grad_sync`` for ops in the autograd engine's final callbacks (the graph task still runs,
  no node does): DDP's finalize, which copies the reduced buckets back into the gradients.
- ``backward`` for the gradient seed (``ones_like``) that ``loss.backward()`` makes before
  the engine runs, with grad mode on.
- ``other`` for setup: the DistributedDataParallel constructor's parameter broadcast, and its
  bucket rebuild in the second forward (broadcasts of the bucket layout).
- an optimizer's closure (``optimizer.step(closure)``: LBFGS, Lightning's loop) runs with the
  optimizer phase lifted: its forward, backward and gradient sync get their own phases.

The subclasses and wrappers that bring torch's calls here live in tracer/recorder/patches
(autograd.py: checkpointing, the gradient seed, the optimizer step hooks; distributed.py: DDP).
"""
from __future__ import annotations

import functools
import weakref

import torch

from tracer.vocab.labels import PHASE_BACKWARD, PHASE_FORWARD, PHASE_GRAD_SYNC, PHASE_OTHER

from .attribution.annotations import NO_PHASE
from .compat import function_application


def _storage_ptr(tensor) -> int:
    """Where a tensor's storage starts; 0 when it has none (freed, resized to 0, meta)."""
    try:
        return tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return 0


_REDUCTIONS = frozenset(("all_reduce", "reduce_scatter", "reduce"))


class PhaseRules:
    """The phase rules of one session (see the module's doc)."""

    def __init__(self, session, modules, annotations):
        self._session = session
        self._modules = modules
        self._annotations = annotations
        self._ddps = weakref.WeakSet()     # DistributedDataParallel wrappers made while recording
        self._owners: dict = {}            # id(parameter) -> (its weakref, module id)

    # ------------------------------------------------------------------ collectives
    def collective(self, phase: int, node, module: int, args, comm) -> int:
        """The phase of a collective the hot path gave ``phase`` (no annotation named one)."""
        if node is not None:
            if phase == PHASE_BACKWARD and "AccumulateGrad" in node.name():
                return PHASE_GRAD_SYNC
            return phase
        if module >= 0 or phase not in (PHASE_FORWARD, PHASE_OTHER):
            return phase      # a module's forward, an optimizer step, the engine's callbacks
        # outside modules and the autograd engine: what it carries decides, not grad mode (a
        # loss all-reduced for logging, a seed broadcast, a barrier run with grad on)
        value = args[comm.input_arg] if comm.input_arg is not None and \
            comm.input_arg < len(args) else None
        while isinstance(value, (list, tuple)) and value:
            value = value[0]
        if not isinstance(value, torch.Tensor) or isinstance(value, torch.nn.Parameter):
            return PHASE_OTHER          # a barrier; parameters (setup)
        # NOTE: the storage test walks every parameter: reductions only (not P2P, gathers)
        if comm.kind in _REDUCTIONS and self._is_grad(value):
            return PHASE_GRAD_SYNC
        if value.requires_grad and torch.is_grad_enabled():
            return PHASE_FORWARD        # an activation autograd records (funcol's autograd ops)
        return PHASE_OTHER              # scalars, metrics, buffers

    def owner_module(self, node) -> int:
        """The module id a gradient collective launched from ``node`` (an AccumulateGrad's
        hook) belongs to: the DDP wrapper holding the parameter, else the parameter's own
        module; -1 when unknown. Cached per parameter."""
        param = getattr(node, "variable", None)
        if param is None:
            return -1
        known = self._owners.get(id(param))
        if known is not None and known[0]() is param:
            return known[1]
        wrappers = list(self._ddps) + [r for r in list(self._modules.roots)
                                       if type(r).__name__ == "DistributedDataParallel"]
        owner = next((ddp for ddp in wrappers if any(p is param for p in ddp.parameters())),
                     None)
        path = self._modules.path_of(owner) if owner is not None else \
            self._modules.path_of_parameter(param)
        module = self._modules.intern(path) if path else -1
        self._owners[id(param)] = (weakref.ref(param), module)
        return module

    def _is_grad(self, value) -> bool:
        ptr = _storage_ptr(value) if type(value) is torch.Tensor else 0
        if ptr == 0:
            return False
        for root in list(self._modules.roots):
            for param in root.parameters():
                for grad in (param.grad, getattr(param, "main_grad", None)):
                    if type(grad) is torch.Tensor and _storage_ptr(grad) == ptr:
                        return True
        return False

    # ------------------------------------------------------------------ custom Functions
    def applied_at(self, frame, stack: int) -> int:
        """The stack of the line that applied the custom autograd Function running ``frame``
        (``stack`` when none does, or stacks are off). autograd makes a Function's node before
        its forward runs (without grad), so the node's first op is inside the forward; its
        backward belongs to the line that called ``apply``, as a built-in op's does."""
        if stack < 0:
            return stack
        found = function_application(frame, 16)
        if found is None or found[1] is None:
            return stack
        return self._session.stacks.capture(found[1])

    # ------------------------------------------------------------------ torch's calls
    # what tracer/recorder/patches wires into torch's functions (docs/phases.md)
    def optimizer_step_begins(self, optimizer, args, kwargs):
        """An optimizer step begins (its pre-hook): the optimizer phase, and its closure
        outside it."""
        self._session.in_optimizer += 1    # the hot path's optimizer phase
        return self._closure_outside_step(args, kwargs)

    def forward_modules(self) -> list:
        """The running modules when checkpointing made a region's frame in the forward."""
        return self._modules.snapshot()

    def recompute_begins(self, forward_modules) -> list:
        """A checkpointed region's recomputation begins, in the backward: its ops are
        ``recompute`` and run under the modules of the forward; returns what to put back."""
        self._session.recompute += 1
        return self._modules.restore(forward_modules)

    def recompute_ends(self, saved: list) -> None:
        self._modules.restore(saved)
        self._session.recompute -= 1

    def reentrant_checkpoint(self, forward, ctx, run_function, args):
        """Reentrant checkpointing's ``CheckpointFunction.forward(ctx, run_function, *args)``
        (``use_reentrant=True``): its backward runs ``ctx.run_function`` again, then a backward
        of its own through what that replay made. The replay is ``recompute``, under the
        modules of the forward (as the non-reentrant recomputation); the inner backward stays
        ``backward``, its ops on the modules of the replayed ops that made their nodes. The
        Function's own node belongs to the module that called checkpoint: its first op, inside
        the function, would otherwise give it the first module the function runs."""
        forward_modules = self.forward_modules()
        out = forward(ctx, run_function, *args)
        self._node_belongs_to(ctx, forward_modules[-1][1] if forward_modules else -1)
        ctx.run_function = self._replay(ctx.run_function, forward_modules)
        return out

    def _replay(self, run_function, forward_modules):
        def replay(*args, **kwargs):
            saved = self.recompute_begins(forward_modules)
            try:
                return run_function(*args, **kwargs)
            finally:
                self.recompute_ends(saved)
        return replay

    def _node_belongs_to(self, node, module: int) -> None:
        """The autograd node ``node`` made in the forward belongs to ``module`` (its origin's
        stack stays)."""
        seq = node._sequence_nr()
        for origins in (self._session.fwd_of_node, self._session.fwd_prev):
            origin = origins.get(seq)
            if origin is not None:
                origins[seq] = (origin >> 32) << 32 | (module + 1)
                return

    def as_gradient_seed(self, fn):
        """``fn`` (the gradient seed ``loss.backward()`` makes before the engine runs, with
        grad mode on) in the backward phase, not forward."""
        return self._annotations.forcing(PHASE_BACKWARD, fn)

    def as_setup(self, fn):
        """``fn`` in the setup phase (``other``): DDP's constructor (its parameter broadcast)
        and the rebuild of its gradient buckets, once, in the second forward (two broadcasts
        of rank 0's bucket layout: integers, no parameter, gradient or activation)."""
        return self._annotations.forcing(PHASE_OTHER, fn)

    def ddp_made(self, ddp) -> None:
        """A DistributedDataParallel wrapper made while recording (:meth:`owner_module`)."""
        self._ddps.add(ddp)

    def _closure_outside_step(self, args: tuple, kwargs: dict):
        """``optimizer.step(closure)`` (LBFGS, Lightning's loop) runs forward and backward inside
        the step: the closure gets its phases as it would outside the step (its modules, the
        autograd engine, gradient hooks...). Returns the step's arguments with the closure
        wrapped, or None without one (the step hook's protocol; args[0] is the optimizer)."""
        closure = kwargs.get("closure") if "closure" in kwargs else \
            args[1] if len(args) > 1 else None
        if not callable(closure):
            return None
        session, annotations = self._session, self._annotations

        @functools.wraps(closure)
        def outside_step(*a, **k):
            depth, session.in_optimizer = session.in_optimizer, 0
            try:
                with annotations.forced(NO_PHASE):
                    return closure(*a, **k)
            finally:
                session.in_optimizer = depth
        if "closure" in kwargs:
            return args, dict(kwargs, closure=outside_step)
        return (args[0], outside_step, *args[2:]), kwargs
