"""Shape signatures: the dtypes and shapes of an op's tensor inputs as one interned string,
``f32[4,64] f32[64,64]``; a list argument is bracketed, ``[f32[4],f32[4]]``."""
from __future__ import annotations

import torch

from .ops import dtype_name


class ShapeSignatures:
    """Tensor inputs of an op -> the id of their signature (each signature is formatted once)."""

    def __init__(self, intern):
        self._intern = intern          # text -> id
        self._ids: dict = {}           # ((dtype, shape) | tuple of them, ...) -> id

    def __call__(self, args) -> int:
        key = []
        for a in args:
            if isinstance(a, torch.Tensor):
                key.append((a.dtype, a.shape))
            elif isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor):
                key.append(tuple((t.dtype, t.shape) for t in a if isinstance(t, torch.Tensor)))
        key = tuple(key)
        sid = self._ids.get(key)
        if sid is None:
            sid = self._ids[key] = self._intern(_text(key))
        return sid


def _text(key) -> str:
    def one(item):
        dtype, shape = item
        return f"{dtype_name(dtype)}[{','.join(map(str, shape))}]"
    parts = []
    for item in key:
        if item and isinstance(item[0], tuple):
            parts.append("[" + ",".join(one(t) for t in item) + "]")
        elif item:
            parts.append(one(item))
        else:
            parts.append("[]")
    return " ".join(parts)
