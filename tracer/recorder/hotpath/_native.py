"""Which hot path the recorder runs: the C extension ``tracer.recorder._hotpath`` (built from
tracer/recorder/csrc/hotpath/) where it is built, else its Python twins in stacks.py and shapes.py.
``PARATRACE_PURE_PYTHON=1`` asks for the Python ones. Both record the same trace; its metadata says
which one ran (``hot_path``). Where the GIL is off (a free-threaded build, 3.13t on), the C
extensions are not built and not imported: their tables assume the GIL, and importing one would
turn the GIL back on for the whole process (docs/compat.md)."""
from __future__ import annotations

import functools
import os
import sys


def gil_enabled() -> bool:
    """Whether the GIL is on in this process (always, before Python 3.13)."""
    is_enabled = getattr(sys, "_is_gil_enabled", None)
    return True if is_enabled is None else bool(is_enabled())


@functools.lru_cache(maxsize=None)
def native_hot_path():
    """The extension module, or None where it is not built, the GIL is off or the environment
    asks for Python (decided once a process, at the recorder's import)."""
    if os.environ.get("PARATRACE_PURE_PYTHON", "") not in ("", "0") or not gil_enabled():
        return None
    try:
        from .. import _hotpath
    except ImportError:
        return None
    return _hotpath
