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
  aliases of its arguments (its schema's ``alias_info``): :func:`returns_only_aliases`.
- what autograd saved for backward, read without unpacking it: a node type's
  ``_raw_saved_<name>`` getters (:func:`saved_tensor_names`, :func:`saved_tensors`), and a
  non-reentrant checkpoint's inputs (:func:`checkpoint_inputs`: its frame's ``saved_args``
  from 2.13, its input saver Function's before).
- torchrun's ``--shutdown-timeout`` (not in 2.10 or 2.11) and ``--signals-to-handle`` (not in
  2.9): :func:`launcher_option` reads an option the running torch's launcher may not define.
"""
from __future__ import annotations

from typing import Optional

import torch

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


# the recorder's memory table keys a storage by its StorageImpl (memory.py reads it directly on
# the hot path); without it memory recording refuses to start
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
