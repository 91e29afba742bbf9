"""Where torch versions differ, in one place: each difference the recorder, trace-run or the
reference GPT meets between the oldest supported torch and the newest, found by feature
detection (what an object has), never by version number. docs/compat.md lists them.

Supported: torch 2.10 .. 2.14 (README); a few bridges reach further back. What differs, and
how it is bridged here:
- ``torch.autograd.Function.apply``: a Python classmethod up to 2.13, a C builtin from 2.14 (no
  frame of its own): :func:`function_application` finds a Function's application either way.
- Dynamo's per-code frame strategy (``set_code_exec_strategy``, 2.7 on): :func:`skip_dynamo`
  marks code Dynamo must never trace; before it, torch has no ``ignore_compile_internals``
  either, so Dynamo compiles nothing while the recorder's mode is on the stack.
- storages' identity for memory recording: ``UntypedStorage._cdata`` (the StorageImpl's
  address, in every torch of the range; :data:`STORAGE_KEYED` says it is there), the same key
  straight from a tensor (:func:`storage_key`: ``torch._C._storage_id`` where torch has it) and
  a DTensor's local shard (``_local_tensor``): :func:`local_tensor`; an op that only returns
  aliases of its arguments (its schema's ``alias_info``): :func:`returns_only_aliases`; a DTensor's
  local shard's shape (:func:`local_shape`, for the parameter layout: no op dispatched).
- what autograd saved for backward, read without unpacking it: a node type's
  ``_raw_saved_<name>`` getters (:func:`saved_tensor_names`, :func:`saved_tensors`), and a
  non-reentrant checkpoint's inputs (:func:`checkpoint_inputs`: its frame's ``saved_args``
  from 2.13, its input saver Function's before).
- torchrun's ``--shutdown-timeout`` (not in 2.10 or 2.11) and ``--signals-to-handle`` (not in
  2.9): :func:`launcher_option` reads an option the running torch's launcher may not define.
- a user's torch.profiler under the recording mode (user_profile.py): a range recorded without
  dispatching an op (``torch._C._profiler._RecordFunctionFast``, 2.10 to 2.14) marks the mode's
  dispatches (:data:`PROFILER_MARK`); the ``_ProfilerResult`` that ``_disable_profiler`` returns is
  read through :class:`UserProfileResult`: its ``events()`` (KinetoEvents: ``is_python_function``
  from 2.13 only), ``save()`` (the Chrome trace) and ``trace_activities()`` (the Python export,
  2.13 on) without the mode's events.
"""
from __future__ import annotations

import functools
from typing import Callable, Optional

import torch

from .user_profile import MARK, PASSED, Event, filter_chrome_trace, own_events, python_name

_apply = torch.autograd.Function.__dict__.get("apply")
# the code of Function.apply where it is Python (a classmethod), else None (C: torch >= 2.14)
APPLY_CODE = getattr(getattr(_apply, "__func__", None), "__code__", None)
_FunctionBase = torch._C._FunctionBase


def function_application(frame, limit: int) -> Optional[tuple]:
    """``(forward frame, caller frame)`` of the innermost autograd Function application that
    ``frame`` runs inside (walking out at most ``limit`` frames), or None.

    Where ``apply`` is Python, its frame marks the application: the forward is the frame it
    called (None when ``frame`` is apply's own) and the caller is apply's. Where ``apply`` is C,
    the forward itself is the mark: a frame named ``forward`` whose first argument is the
    Function's context (forward(ctx, ...)); a Function with ``setup_context`` has no context in
    its forward, and is not found there."""
    callee, depth = None, 0
    while frame is not None and depth < limit:
        code = frame.f_code
        if APPLY_CODE is not None:
            if code is APPLY_CODE:
                return callee, frame.f_back
        elif code.co_name == "forward" and code.co_argcount and \
                isinstance(frame.f_locals.get(code.co_varnames[0]), _FunctionBase):
            return frame, frame.f_back
        callee, frame, depth = frame, frame.f_back, depth + 1
    return None


def skip_dynamo(code) -> bool:
    """Dynamo runs ``code``, and everything it calls, without tracing it (what
    ``torch._dynamo.disable(recursive=True)`` does, without its wrapper). False where this torch
    has no per-code strategy (before 2.7): there it marks the frame alone (``skip_code``)."""
    eval_frame = torch._C._dynamo.eval_frame
    if hasattr(eval_frame, "set_code_exec_strategy"):
        skip = eval_frame._FrameAction.SKIP
        eval_frame.set_code_exec_strategy(code, eval_frame._FrameExecStrategy(skip, skip))
        return True
    eval_frame.skip_code(code)
    return False


def launcher_option(args, name: str, default=None):
    """A torchrun option of the parsed ``args``, or ``default`` where this torch's launcher
    does not define it (``shutdown_timeout``, ``signals_to_handle``: docs/compat.md)."""
    return getattr(args, name, default)


# the recorder's memory table keys a storage by its StorageImpl (memory_recorder.py reads it
# directly on the hot path); without it memory recording refuses to start
STORAGE_KEYED = hasattr(torch.UntypedStorage, "_cdata")


def _key_through_storage(tensor) -> int:
    return tensor.untyped_storage()._cdata


# a tensor's storage key, ``tensor.untyped_storage()._cdata``, without making the storage's
# Python object: ``torch._C._storage_id`` gives the same address (2.10 to 2.14: 54 ns against
# 103 ns); it raises as ``untyped_storage`` does for a tensor without storage
storage_key = getattr(torch._C, "_storage_id", _key_through_storage)


def returns_only_aliases(func) -> bool:
    """Every value op overload ``func`` returns is one of its arguments or a view of one (the
    alias annotations of its schema: views, in-place and ``out=`` ops): it makes no storage.
    Not ``aten.lift_fresh``: its argument is a tensor just made from Python data
    (``torch.tensor``), outside the dispatcher, which it is the first op to return."""
    returns = getattr(getattr(func, "_schema", None), "returns", None)
    return bool(returns) and all(ret.alias_info is not None for ret in returns) and \
        func._schema.name != "aten::lift_fresh"


def local_tensor(tensor):
    """A DTensor's local shard (what this rank allocates), else ``tensor`` itself."""
    local = getattr(tensor, "_local_tensor", None)
    return local if isinstance(local, torch.Tensor) else tensor


# a node's saved tensors: its type's getters named _raw_saved_<name> (an op's node: one a
# SavedVariable, a tuple for a list of them; a custom Function's node: _raw_saved_tensors)
# give torch's SavedTensor, whose ``data`` is what autograd holds without unpacking it:
# nothing is dispatched, no unpack hook runs (checkpointing's raises when its tensor is
# unpacked twice). That is the tensor (None once released, or never saved), or, saved under
# saved_tensors_hooks, what their pack hook returned (checkpointing's: a holder, no tensor)
_SAVED = "_raw_saved_"
SavedTensor = getattr(torch._C._autograd, "SavedTensor", None)


def saved_tensor_names(node_type: type) -> tuple[str, ...]:
    """The names of the saved-tensor getters of an autograd node type, sorted (() where this
    torch has none)."""
    return tuple(name for name in dir(node_type) if name.startswith(_SAVED))


def saved_tensors(saved) -> list:
    """The tensors autograd holds for a node's saved-tensor getter (a SavedTensor or a tuple
    of them): each one's ``data`` that is a tensor."""
    out = []
    for one in saved if isinstance(saved, (tuple, list)) else (saved,):
        data = one.data if one is not None else None
        if isinstance(data, torch.Tensor):
            out.append(data)
    return out


def checkpoint_inputs(frame) -> list:
    """The inputs a non-reentrant checkpoint (torch.utils.checkpoint's ``_CheckpointFrame``)
    saved to recompute from: from 2.13 SavedTensors in the frame's ``saved_args``, before it the
    saved tensors of its input saver Function's node (``input_saver.grad_fn``)."""
    saved = [arg for arg in getattr(frame, "saved_args", None) or ()
             if SavedTensor is not None and isinstance(arg, SavedTensor)]
    node = getattr(getattr(frame, "input_saver", None), "grad_fn", None)
    for name in saved_tensor_names(type(node)) if node is not None else ():
        saved.extend(getattr(node, name) or ())
    return saved_tensors(tuple(saved))


_RecordFunctionFast = getattr(getattr(torch._C, "_profiler", None), "_RecordFunctionFast", None)
# a new profiler range named MARK (a context manager), or None where this torch cannot record one
# without dispatching an op (torch.profiler.record_function dispatches: every mode would see it)
PROFILER_MARK: Optional[Callable] = \
    functools.partial(_RecordFunctionFast, MARK) if _RecordFunctionFast is not None else None
PROFILER_PASSED: Optional[Callable] = \
    functools.partial(_RecordFunctionFast, PASSED) if _RecordFunctionFast is not None else None


class _Amended:
    """A KinetoEvent or trace activity linked to another op's correlation id, or renamed."""
    __slots__ = ("_event", "_linked", "_name")

    def __init__(self, event, linked: Optional[int], name: Optional[str]):
        self._event, self._linked, self._name = event, linked, name

    def linked_correlation_id(self) -> int:
        return self._event.linked_correlation_id() if self._linked is None else self._linked

    def name(self) -> str:
        return self._event.name() if self._name is None else self._name

    def __getattr__(self, name):
        return getattr(self._event, name)


def _without_own(items: list, views: list[Event]) -> list:
    own = own_events(views)
    if not own.dropped and not own.renamed:
        return items
    out = []
    for i, (item, view) in enumerate(zip(items, views)):
        if i in own.dropped:
            continue
        linked, name = own.relink.get(view.linked), own.renamed.get(i)
        out.append(item if linked is None and name is None else _Amended(item, linked, name))
    return out


def _event_view(event) -> Event:
    name = event.name()
    python = event.is_python_function() if hasattr(event, "is_python_function") else \
        python_name(name)
    return Event((int(event.device_type()), event.device_index(), event.start_thread_id()),
                 event.start_ns(), event.end_ns(), name, python, event.correlation_id(),
                 event.linked_correlation_id())


def _activity_view(act) -> Event:
    start = act.timestamp()
    return Event((act.device_id(), act.resource_id()), start, start + max(act.duration(), 0),
                 act.name(), act.type() == "python_function", act.correlation_id(),
                 act.linked_correlation_id())


class UserProfileResult:
    """The ``_ProfilerResult`` of a user's profiler that ran beside the recording mode, read as
    it would be without the mode (user_profile.py): ``events()`` (key_averages, the event
    tree), ``save()`` (export_chrome_trace) and ``trace_activities()`` (the Python export)
    leave the mode's events out; everything else is torch's own."""

    def __init__(self, result):
        self._result = result
        self._events: Optional[list] = None

    def events(self) -> list:
        if self._events is None:
            events = self._result.events()
            self._events = _without_own(events, [_event_view(e) for e in events])
        return self._events

    def trace_activities(self) -> list:
        acts = self._result.trace_activities()
        return _without_own(acts, [_activity_view(a) for a in acts])

    def save(self, path: str) -> None:
        self._result.save(path)
        filter_chrome_trace(path)

    def __getattr__(self, name):
        return getattr(self._result, name)


def local_shape(tensor) -> Optional[tuple]:
    """A DTensor's local shard's shape, read without dispatching an op (``to_local()`` runs a
    view the recorder would record as the user's), or None for a plain tensor."""
    local = getattr(tensor, "_local_tensor", None)
    return tuple(local.shape) if isinstance(local, torch.Tensor) else None
