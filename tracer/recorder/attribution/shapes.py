"""Shape signatures: the dtypes and shapes of an op's tensor inputs as one interned string,
``f32[4,64] f32[64,64]``; a list argument is bracketed, ``[f32[4],f32[4]]``."""
from __future__ import annotations

import inspect

import torch

from tracer.vocab.ops import dtype_name

from ..hotpath._native import native_hot_path

_Tensor = torch.Tensor
_Parameter = torch.nn.Parameter


class _PyShapeKeys:
    """ShapeSignatures' hot path in Python: the twin of tracer/recorder/csrc/hotpath/'s ShapeKeys,
    which replaces it where the extension is built."""

    def id_of(self, args) -> int:
        """Hot path: one flat key of the tensors' dtypes and shapes, one dict lookup."""
        key = ()
        for a in args:
            cls = type(a)
            if cls is _Tensor or cls is _Parameter:      # most arguments: no kind lookup
                key += (a.dtype, a.shape)
                continue
            kind = _KIND_OF_TYPE.get(cls) or _kind(cls)
            if kind == _TENSOR:
                key += (a.dtype, a.shape)
            elif kind == _SEQUENCE and a and (_KIND_OF_TYPE.get(type(a[0])) or
                                              _kind(type(a[0]))) == _TENSOR:
                key += (tuple([(t.dtype, t.shape) for t in a if isinstance(t, _Tensor)]),)
        sid = self._ids.get(key)
        if sid is None:
            sid = self._new(key)
        return sid


class _Signatures:
    """Tensor inputs of an op -> the id of their signature (each signature is formatted once).
    The hot path (``id_of``) is its base's: ShapeSignatures' is C where the extension is built,
    PyShapeSignatures' Python."""

    def __init__(self, intern):
        self._intern = intern          # text -> id
        self._ids = {}                 # (dtype, shape, ..., (list's (dtype, shape)...), ...) -> id
        self._kind_of_type = _KIND_OF_TYPE
        self._kind = _kind
        self._tensor, self._parameter = _Tensor, _Parameter
        # the C twin's: its own keys (packed bytes), and the attributes it reads
        self._byte_ids = {}
        self._dtype_attr, self._shape_attr = _descriptor("dtype"), _descriptor("shape")

    def _new(self, key: tuple) -> int:
        sid = self._ids[key] = self._intern(_text(key))
        return sid

    def _id_of_new(self, args) -> int:
        """The C twin's miss: the id of arguments whose packed key it has not seen, from the
        Python twin's key."""
        return _PyShapeKeys.id_of(self, args)


# NOTE: isinstance(x, torch.Tensor) goes through Tensor's metaclass, ~100 ns for anything but
# an exact Tensor (an int, a Parameter); an argument's kind is looked up by its type instead.
_OTHER, _TENSOR, _SEQUENCE = 1, 2, 3
_KIND_OF_TYPE: dict = {}


def _descriptor(name: str):
    """The getset descriptor that ``tensor.<name>`` runs on a plain Tensor and a Parameter
    (torch's C attribute), or None if either class resolves the name to something else."""
    found = [inspect.getattr_static(cls, name, None) for cls in (_Tensor, _Parameter)]
    if found[0] is found[1] and type(found[0]).__name__ == "getset_descriptor":
        return found[0]
    return None


def _kind(cls) -> int:
    kind = _TENSOR if issubclass(cls, _Tensor) else \
        _SEQUENCE if cls is list or cls is tuple else _OTHER
    _KIND_OF_TYPE[cls] = kind
    return kind


def _text(key: tuple) -> str:
    def one(dtype, shape):
        return f"{dtype_name(dtype)}[{','.join(map(str, shape))}]"
    parts = []
    i = 0
    while i < len(key):
        if isinstance(key[i], tuple) and not isinstance(key[i], torch.Size):   # a list argument
            parts.append("[" + ",".join(one(*t) for t in key[i]) + "]")
            i += 1
        else:
            parts.append(one(key[i], key[i + 1]))
            i += 2
    return " ".join(parts)


class PyShapeSignatures(_Signatures, _PyShapeKeys):
    """ShapeSignatures whose hot path is Python (tests; where the C extension is not built)."""


class ShapeSignatures(_Signatures, getattr(native_hot_path(), "ShapeKeys", _PyShapeKeys)):
    """The signatures the recorder uses: the C hot path where it is built, else Python's."""
