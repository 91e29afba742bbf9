"""Higher-order operators (HOPs) under the recorder: ``torch.cond``, ``while_loop``, ``map``,
``associative_scan``, ``scan``, ``invoke_subgraph``, eager ``flex_attention`` and any other
operator torch dispatches as a ``HigherOrderOperator`` (docs/phases.md#higher-order-operators).

A TorchDispatchMode sees a HOP only if it says ``supports_higher_order_operators`` (else torch
raises NotImplementedError and the traced run dies); torch then calls the mode with the HOP and
the mode off the stack. Here each HOP call becomes an annotation range labelled
``higher_order.<name>`` with attributes ``{"source": "higher_order", "hop": name, "module",
"code": "file:line"}`` (the module and the user's line that called it; the range's row carries
the same module and stack; ``"pass": "backward"`` for a HOP the autograd engine runs: the
backward of cond or scan), and the HOP runs its eager kernel (the one torch would run below the
mode: CompositeExplicitAutograd for every HOP of torch 2.13) so the ops it runs are recorded
inside the range, with the phases of the usual rules:

- a kernel that runs its subgraphs with no dispatch mode allowed (cond, invoke_subgraph, scan,
  strict_mode, the BaseHOP family: they assert it) runs as it would untraced, and its subgraphs
  (the callables among its arguments) run with the mode back on: the ops of the subgraphs are
  recorded, the kernel's own glue around them (scan's slicing and stacking) is not;
- any other kernel (while_loop, map, associative_scan's generic path, flex_attention's dense
  implementation) runs with the mode on: everything it dispatches is recorded.

A HOP with no eager kernel for its arguments (one only Dynamo, functionalization or a tensor
subclass implements) runs through untouched, as it would without the recorder, inside a range
with ``"traced": false``, and the trace's metadata says so once per HOP (``untraced_hops``:
``{name: why}``). A HOP on tensor subclasses (DTensor, FakeTensor) is left to the subclass, as
torch does when a mode answers NotImplemented. ``tag_activation_checkpoint`` never reaches a
dispatch mode in eager code (it calls torch.utils.checkpoint directly): its call gets the range
through a wrapper of its ``__call__`` instead (tracer/recorder/patches/dynamo.py), and its ops are
recorded as checkpointing's.
"""
from __future__ import annotations

import sys
from time import perf_counter_ns as _now

import torch

from ..attribution.stacks import USER

LABEL_PREFIX = "higher_order."
SOURCE = "higher_order"
META_KEY = "untraced_hops"
# what torch's eager kernels that forbid modes assert (cond.py, scan.py, base_hop.py ...)
_NO_MODE = "Mode should never be enabled for CPU/CUDA key"

_C = torch._C
_BELOW_PYTHON = _C._dispatch_keyset_full_after(_C.DispatchKey.Python)
_push = _C._push_on_torch_dispatch_stack
_pop = _C._pop_torch_dispatch_stack
_top_mode = torch.utils._python_dispatch._get_current_dispatch_mode


def _has_python_key(value) -> bool:
    return isinstance(value, torch.Tensor) and _C._dispatch_keys(value).has(_C.DispatchKey.Python)


def _subclass_args(args, kwargs) -> bool:
    """Whether a tensor subclass (DTensor, FakeTensor) is among the HOP's arguments, as torch's
    HOP dispatch looks for them (top level and one list deep)."""
    for arg in (*args, *kwargs.values()):
        if _has_python_key(arg) or (isinstance(arg, (list, tuple))
                                    and any(_has_python_key(a) for a in arg)):
            return True
    return False


def _code_of(kernel):
    kernel = getattr(kernel, "func", kernel)          # functools.partial
    kernel = getattr(kernel, "__func__", kernel)      # a bound method (BaseHOP's kernels)
    return getattr(kernel, "__code__", None)


class _Reentered:
    """A subgraph of a kernel that forbids modes: runs with the recording mode back on top.
    Everything else (attributes a kernel reads: ``_boxed_call``, ``graph``) is the subgraph's."""

    def __init__(self, fn, mode):
        self._fn, self._mode = fn, mode

    def __getattr__(self, name):
        fn = self.__dict__.get("_fn")
        if fn is None:
            raise AttributeError(name)
        return getattr(fn, name)

    def __call__(self, *args, **kwargs):
        if _top_mode() is self._mode:
            return self._fn(*args, **kwargs)
        _push(self._mode)
        try:
            return self._fn(*args, **kwargs)
        finally:
            _pop(None)


def _reentered(value, mode):
    """``value`` with its callables (a subgraph, or one in a plain list or tuple: a block
    mask's mask_mod) as :class:`_Reentered`."""
    if callable(value) and not isinstance(value, (torch.Tensor, type)):
        return _Reentered(value, mode)
    if type(value) in (list, tuple) and any(callable(v) for v in value):
        return type(value)(_reentered(v, mode) for v in value)
    return value


class HigherOrderOps:
    """The recording mode's handler of HOPs (called from comm.special_op with the mode off the
    stack, as torch's HOP dispatch leaves it)."""

    def __init__(self, session, mode):
        self._session = session
        self._mode = mode
        self._plans: dict = {}      # (id(hop), dispatch key) -> (kernel, mode on) or why not
        self._noted: set = set()

    def __call__(self, func, args, kwargs):
        if _subclass_args(args, kwargs):
            return NotImplemented            # the subclass's own rule for this HOP runs next
        name = func.name()
        plan = self._plan(func, args, kwargs)
        traced = not isinstance(plan, str)
        if not traced:
            self._note(name, plan)
        opened, t0 = open_range(self._session, name, traced)
        try:
            if not traced:
                return func(*args, **kwargs)
            kernel, mode_on = plan
            if mode_on:
                _push(self._mode)
                try:
                    return kernel(*args, **kwargs)
                finally:
                    _pop(None)
            return kernel(*(_reentered(a, self._mode) for a in args),
                          **{k: _reentered(v, self._mode) for k, v in kwargs.items()})
        finally:
            close_range(self._session, opened, t0)

    def _plan(self, func, args, kwargs):
        """(eager kernel, whether it runs with the mode on), or why there is none."""
        try:
            keys = torch._ops._compute_keyset(args, kwargs, func.non_fallthrough_keys)
            key = (keys & _BELOW_PYTHON).highestPriorityTypeId()
        except Exception as exc:      # never let the recorder break a HOP: run it untouched
            return f"no dispatch key ({type(exc).__name__}: {exc})"
        cached = self._plans.get((id(func), key))
        if cached is not None:        # its id is this HOP's: the entry keeps the HOP alive
            return cached[1]
        try:
            kernel = func.py_kernels[torch._ops.resolve_key(func, key)]
        except (NotImplementedError, KeyError, RuntimeError) as exc:
            plan = f"no eager kernel for {key} ({type(exc).__name__})"
        else:
            code = _code_of(kernel)
            plan = (kernel, code is not None and _NO_MODE not in code.co_consts)
        self._plans[(id(func), key)] = (func, plan)     # the entry keeps the HOP alive
        return plan

    def _note(self, name: str, why: str) -> None:
        if name not in self._noted:
            self._noted.add(name)
            self._session.flusher.merge_meta(META_KEY, {name: why})


def open_range(session, name: str, traced: bool = True) -> tuple:
    """Open the range of one HOP call: ((its entry, module, stack), t0)."""
    module = session.modules.current
    here = sys._getframe()      # the interner skips paratrace's and torch's dispatch frames
    stack = session.stacks.capture(here) if session.options.record_stacks else -1
    attrs = {"source": SOURCE, "hop": name, "module": session.modules.path,
             "code": _user_line(session.stacks, here)}
    if torch._C._current_autograd_node() is not None:
        attrs["pass"] = "backward"          # a HOP's backward (cond's, scan's) in the engine
    if not traced:
        attrs["traced"] = False
    return (session.open_range(LABEL_PREFIX + name, attrs), module, stack), _now()


def close_range(session, opened: tuple, t0: int) -> None:
    entry, module, stack = opened
    session.close_range(entry, t0, module=module, stack=stack)


def _user_line(stacks, frame) -> str:
    """``file:line`` of the innermost user frame from ``frame`` outwards, or "?"."""
    while frame is not None:
        known = stacks.kind_of_code.get(id(frame.f_code)) or stacks.classify(frame.f_code)
        if known[0] == USER:
            return f"{frame.f_code.co_filename}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


def call_tag_activation_checkpoint(session, original, hop, gmod, args, kwargs):
    """``tag_activation_checkpoint``'s call (``original``: its ``__call__``) inside a range;
    it bypasses the dispatcher in eager code (tracer/recorder/patches/dynamo.py routes it here)."""
    # NOTE: export's pre-dispatch tracing goes on to the HOP's dispatch (torch's test)
    if session.passthrough or not session.is_open or torch.compiler.is_compiling() or \
            torch._ops._compute_keyset(args, kwargs, hop.non_fallthrough_keys) \
            .highestPriorityTypeId() == _C.DispatchKey.PreDispatch:
        return original(hop, gmod, *args, **kwargs)
    opened, t0 = open_range(session, hop.name())
    try:
        return original(hop, gmod, *args, **kwargs)
    finally:
        close_range(session, opened, t0)
