"""FLOPs of recorded ops, computed from the trace's ``shapes`` column alone (no tensors).

The formulas are torch.utils.flop_counter's (2*m*k*n for a matmul; attention as its matmuls,
the backward recomputing the scores), restated here over shapes parsed from strings like
``f32[4,64] f32[64,128]`` so that reading traces never imports torch; tests check them against
torch's FlopCounterMode. Ops are looked up in a table, the way flop_counter registers its
formulas. Convolutions are not counted: their stride, padding and dilation are not recorded, so
the output size (and thus the FLOPs) is unknown.
"""
from __future__ import annotations

import re
from functools import lru_cache
from typing import Callable, Optional, Union

_TENSOR = re.compile(r"^[A-Za-z0-9_]+\[([0-9,]*)\]$")

Shape = tuple[int, ...]
# one argument: a tensor's shape, a tensor list's, None when unreadable
ShapeArg = Union[Shape, list[Optional[Shape]], None]
Formula = Callable[[list[ShapeArg]], int]


def parse_shapes(text: Optional[str]) -> list[ShapeArg]:
    """Top-level arguments of a shapes string: a tuple of ints per tensor, a list of tuples for
    a bracketed list argument, None for anything unreadable."""
    if not text:
        return []
    out: list[ShapeArg] = []
    for token in text.split(" "):
        if token.startswith("[") and token.endswith("]") and not _TENSOR.match(token):
            inner = token[1:-1]
            out.append([_shape(t) for t in re.findall(r"[A-Za-z0-9_]+\[[0-9,]*\]", inner)])
        else:
            out.append(_shape(token))
    return out


def _shape(token: str) -> Optional[Shape]:
    match = _TENSOR.match(token)
    if not match:
        return None
    dims = match.group(1)
    return tuple(int(d) for d in dims.split(",")) if dims else ()


def _mm(a: Shape, b: Shape) -> int:
    (m, k), (k2, n) = a, b
    if k != k2:
        raise ValueError("inner dimensions differ")
    return 2 * m * k * n


def _bmm(a: Shape, b: Shape) -> int:
    (batch, m, k), (batch2, k2, n) = a, b
    if batch != batch2 or k != k2:
        raise ValueError("batch or inner dimensions differ")
    return 2 * batch * m * k * n


def _sdpa(q: Shape, k: Shape, v: Shape) -> int:
    """scores = q @ k^T, out = scores @ v (query heads count, as for grouped-query attention)."""
    (b, h, s_q, d), (_, _, s_k, _), d_v = q, k, v[3]
    return 2 * b * h * s_q * s_k * (d + d_v)


def _sdpa_backward(grad: Shape, q: Shape, k: Shape, v: Shape) -> int:
    """Recomputed scores, grad scores and grad v, grad q and grad k: five matmuls."""
    (b, h, s_q, d), (_, _, s_k, _), d_v = q, k, v[3]
    return 2 * b * h * s_q * s_k * (d + 2 * d_v + 2 * d)


def _first(n: int, formula: Callable[..., int], skip: int = 0) -> Formula:
    """A formula over the tensor arguments ``skip`` .. ``skip + n`` (skip: an added bias)."""
    def apply(shapes: list[ShapeArg]) -> int:
        tensors = [s for s in shapes if isinstance(s, tuple)][skip:skip + n]
        if len(tensors) < n:
            return 0
        return int(formula(*tensors))
    return apply


_SDPA = _first(3, _sdpa)
_SDPA_BACKWARD = _first(4, _sdpa_backward)

# Base op name (namespace and overload stripped) -> formula over parsed shapes.
FORMULAS: dict[str, Formula] = {
    "mm": _first(2, _mm),
    "addmm": _first(2, _mm, skip=1),
    "bmm": _first(2, _bmm),
    "baddbmm": _first(2, _bmm, skip=1),
    "_scaled_dot_product_flash_attention": _SDPA,
    "_scaled_dot_product_flash_attention_for_cpu": _SDPA,
    "_scaled_dot_product_efficient_attention": _SDPA,
    "_scaled_dot_product_cudnn_attention": _SDPA,
    "_scaled_dot_product_flash_attention_backward": _SDPA_BACKWARD,
    "_scaled_dot_product_flash_attention_for_cpu_backward": _SDPA_BACKWARD,
    "_scaled_dot_product_efficient_attention_backward": _SDPA_BACKWARD,
    "_scaled_dot_product_cudnn_attention_backward": _SDPA_BACKWARD,
}


def base_name(op: str) -> str:
    """``aten.mm.default`` -> ``mm``."""
    parts = op.split(".")
    return parts[1] if len(parts) >= 2 else op


@lru_cache(maxsize=65536)
def flops(op: str, shapes: Optional[str]) -> int:
    """FLOPs of one call of ``op`` on inputs of ``shapes``; 0 when no formula applies."""
    formula = FORMULAS.get(base_name(op))
    if formula is None or not shapes:
        return 0
    try:
        return formula(parse_shapes(shapes))
    except (ValueError, IndexError, TypeError):
        return 0   # shapes that do not fit the formula (a recording of another overload)
