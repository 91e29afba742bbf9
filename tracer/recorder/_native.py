"""Which hot path the recorder runs: the C extension ``tracer.recorder._hotpath`` (built from
tracer/recorder/csrc/) where it is built, else its Python twins in stacks.py and shapes.py.
``PARATRACE_PURE_PYTHON=1`` asks for the Python ones. Both record the same trace; its metadata says
which one ran (``hot_path``)."""
from __future__ import annotations

import functools
import os


@functools.lru_cache(maxsize=None)
def native_hot_path():
    """The extension module, or None where it is not built or the environment asks for Python
    (decided once a process, at the recorder's import)."""
    if os.environ.get("PARATRACE_PURE_PYTHON", "") not in ("", "0"):
        return None
    try:
        from . import _hotpath
    except ImportError:
        return None
    return _hotpath
