"""The private TorchDispatchMode: it only intercepts and hands each op to the session; and the
two moves that take it off torch's dispatch mode stack outside recorded steps and put it back;
and :func:`op_entry`, what the session caches of each op overload it dispatches."""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tracer.vocab import ops

from ..compat import skip_dynamo

_stack_len = torch._C._len_torch_dispatch_stack
_stack_at = torch._C._get_dispatch_stack_at
_pop = torch._C._pop_torch_dispatch_stack
_push = torch._C._push_on_torch_dispatch_stack
_NO_KWARGS: dict = {}


def op_entry(specs: dict, op_ids, func) -> tuple:
    """(op id, CommSpec, special, what to call, the overload) of an op overload, cached in
    ``specs`` by id (the session's ``_specs``, which the C hot path reads too)."""
    spec = ops.classify(func)
    # a plain OpOverload's __call__ only forwards to _op: call that, one frame less
    call = func._op if type(func) is torch._ops.OpOverload else func
    entry = specs[id(func)] = (op_ids(spec.name), spec.comm, spec.special, call, func)
    return entry


class RecordingMode(TorchDispatchMode):
    # torch.cond, flex_attention... reach __torch_dispatch__ instead of failing (hops.py)
    supports_higher_order_operators = True

    def __init__(self, on_op, compiled: bool = True):
        super().__init__()
        self._on_op = on_op
        # ops on tensor subclasses (DTensor, FakeTensor, AsyncCollectiveTensor): dtensor.py
        self.on_subclass = lambda func, types, args, kwargs: on_op(func, args, kwargs)
        self._compiled = compiled   # torch.compile's code runs compiled (compiled.py)
        self._depth = -1            # stack position while suspended, else -1

    def ignore_compile_internals(self) -> bool:
        # NOTE: torch asks every mode on the stack (an instance method answers as well as a
        # classmethod): True lets Dynamo compile while the mode records, with the mode off the
        # stack while it compiles and on while compiled code runs; False: Dynamo skips every
        # frame and the program runs eagerly, op by op (compiled="eager").
        return self._compiled

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # NOTE: torch wraps a mode's __torch_dispatch__ in torch._dynamo.disable, a Python
        # wrapper that costs about 1.3 us an op on CPU, so that Dynamo never traces it.
        # skip_dynamo() marks the code instead: the same effect, at no cost per op.
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if types:      # () for plain tensors: the hot path pays this one test
            return self.on_subclass(func, types, args, kwargs or _NO_KWARGS)
        return self._on_op(func, args, kwargs or _NO_KWARGS)

    def dispatch_in_c(self, op_dispatch, session) -> None:
        """torch calls ``op_dispatch`` (tracer.recorder._hotpath.OpDispatch) for this mode instead
        of
        __torch_dispatch__: it records plain ops in C and hands everything else to the method
        below (torch looks the name up on the instance and only asks that its __self__ be the
        mode). The C path has no Python frame of its own, the method two: the frame an op is
        attributed to is the same on either (the caller of the dispatch)."""
        in_python = type(self).__torch_dispatch__.__get__(self)
        self.__torch_dispatch__ = op_dispatch(self, session, in_python)

    def dispatch_in_python(self) -> None:
        """Undo dispatch_in_c (and the reference cycle it makes through the mode)."""
        self.__dict__.pop("__torch_dispatch__", None)

    def mark_dispatch(self, mark, passed) -> None:
        """While a user's torch.profiler runs: each dispatch inside ``mark()``, a profiler range
        that tells the user's profile which of its events this mode made, and ``passed()`` after
        it where the mode answered NotImplemented (a DTensor op handed to DTensor's own
        dispatch: user_profile.py), on the Python path (the C path has no frame to open a range
        in)."""
        if "_unmarked" not in self.__dict__:
            self._unmarked = self.__dict__.get("__torch_dispatch__")
            self._mark, self._passed = mark, passed
            self.__torch_dispatch__ = self._dispatch_marked

    def unmark_dispatch(self) -> None:
        """Undo mark_dispatch: back to the path the mode took before."""
        if "_unmarked" in self.__dict__:
            before = self.__dict__.pop("_unmarked")
            if before is None:
                self.__dict__.pop("__torch_dispatch__", None)
            else:
                self.__torch_dispatch__ = before

    def _dispatch_marked(self, func, types, args=(), kwargs=None):
        # one frame, as __torch_dispatch__: on_op's caller is two frames up either way
        with self._mark():
            if not types:
                return self._on_op(func, args, kwargs or _NO_KWARGS)
            out = self.on_subclass(func, types, args, kwargs or _NO_KWARGS)
        if out is NotImplemented:
            with self._passed():
                pass
        return out

    @classmethod
    def skip_dynamo(cls) -> None:
        """Dynamo runs __torch_dispatch__, and everything it calls, without tracing it (what
        torch._dynamo.disable(recursive=True) does)."""
        skip_dynamo(cls.__torch_dispatch__.__code__)
        skip_dynamo(cls._dispatch_marked.__code__)

    # NOTE: suspending and resuming move only torch's C++ stack entry, not the Python flags
    # that __enter__ set (torch.compile keeps skipping frames, as while recording); __enter__
    # and __exit__ still run exactly once, around the whole recording.
    def suspend(self) -> bool:
        """Take the mode off this thread's dispatch stack if it is on top (torch pops modes
        last in, first out); returns whether it did. The caller runs on the thread that
        entered the mode."""
        depth = _stack_len()
        if self._depth >= 0 or depth == 0 or _stack_at(depth - 1) is not self:
            return False
        _pop(None)
        self._depth = depth - 1
        return True

    def resume(self) -> None:
        """Put a suspended mode back where it was, under any mode pushed since."""
        if self._depth < 0:
            return
        above = [_pop(None) for _ in range(max(0, _stack_len() - self._depth))]
        _push(self)
        for mode in reversed(above):
            _push(mode)
        self._depth = -1

    @property
    def suspended(self) -> bool:
        return self._depth >= 0
