"""The private TorchDispatchMode: it only intercepts and hands each op to the session."""
from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode


class RecordingMode(TorchDispatchMode):
    def __init__(self, on_op):
        super().__init__()
        self._on_op = on_op

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return self._on_op(func, args, kwargs or {})
