"""FLOPs of recorded ops, computed from the trace's ``shapes`` column alone (no tensors).

The formulas are torch.utils.flop_counter's (2*m*k*n for a matmul, its attention formulas), fed
with shapes parsed from strings like ``f32[4,64] f32[64,128]``. Ops are looked up in a table, the
way flop_counter registers its formulas. Convolutions are not counted: their stride, padding and
dilation are not recorded, so the output size (and thus the FLOPs) is unknown.
"""
from __future__ import annotations

import re
from functools import lru_cache
from typing import Callable, Optional

from torch.utils import flop_counter as _fc

_TENSOR = re.compile(r"^[A-Za-z0-9_]+\[([0-9,]*)\]$")

Shape = tuple


def parse_shapes(text: Optional[str]) -> list:
    """Top-level arguments of a shapes string: a tuple of ints per tensor, a list of tuples for
    a bracketed list argument, None for anything unreadable."""
    if not text:
        return []
    out = []
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


def _first(n: int, formula: Callable) -> Callable:
    """A formula over the first ``n`` tensor arguments."""
    def apply(shapes: list) -> int:
        tensors = [s for s in shapes if isinstance(s, tuple)][:n]
        if len(tensors) < n:
            return 0
        return int(formula(*tensors))
    return apply


def _sdpa(shapes: list) -> int:
    q, k, v = ([s for s in shapes if isinstance(s, tuple)] + [None] * 3)[:3]
    return int(_fc.sdpa_flop_count(q, k, v)) if v and len(q) == 4 else 0


def _sdpa_backward(shapes: list) -> int:
    g, q, k, v = ([s for s in shapes if isinstance(s, tuple)] + [None] * 4)[:4]
    return int(_fc.sdpa_backward_flop_count(g, q, k, v)) if v and len(q) == 4 else 0


# Base op name (namespace and overload stripped) -> formula over parsed shapes.
FORMULAS: dict = {
    "mm": _first(2, _fc.mm_flop),
    "addmm": _first(3, _fc.addmm_flop),
    "bmm": _first(2, _fc.bmm_flop),
    "baddbmm": _first(3, _fc.baddbmm_flop),
    "_scaled_dot_product_flash_attention": _sdpa,
    "_scaled_dot_product_flash_attention_for_cpu": _sdpa,
    "_scaled_dot_product_efficient_attention": _sdpa,
    "_scaled_dot_product_cudnn_attention": _sdpa,
    "_scaled_dot_product_flash_attention_backward": _sdpa_backward,
    "_scaled_dot_product_flash_attention_for_cpu_backward": _sdpa_backward,
    "_scaled_dot_product_efficient_attention_backward": _sdpa_backward,
    "_scaled_dot_product_cudnn_attention_backward": _sdpa_backward,
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
    except (ValueError, IndexError, TypeError, AssertionError):
        return 0   # shapes that do not fit the formula (a recording of another overload)
