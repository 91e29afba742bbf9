"""Source files of a run: short display paths, definition lines, the files themselves.

Traces store absolute file paths of the recording machine. This module turns them into short
paths for display (``sample_runs/model.py``, ``torch/nn/modules/linear.py``), finds where each
function is defined (by parsing the file with ``ast``, never importing it), and reads the
files for the report's source pages.
Only ``.py`` files are read: a trace from someone else must not pull arbitrary local files into
a report.
"""
from __future__ import annotations

import ast
import os
import re
from functools import lru_cache
from typing import Iterable, Optional

_LIB_MARKERS = ("/site-packages/", "/dist-packages/")
_STDLIB = re.compile(r"/lib/python\d+(\.\d+)?/")
_MAX_SOURCE_BYTES = 2_000_000


def is_library(file: str) -> bool:
    """Whether a recorded file is library code (site-packages, the stdlib, generated code)."""
    return file.startswith("<") or any(m in file for m in _LIB_MARKERS) \
        or bool(_STDLIB.search(file))


def _library_display(file: str) -> str:
    for marker in _LIB_MARKERS:
        if marker in file:
            return file.split(marker, 1)[1]
    match = _STDLIB.search(file)
    return file[match.end():] if match else file


def _package_root(directory: str) -> str:
    """Climb out of Python packages, so ``.../repo/sample_runs/parallel`` shows as
    ``sample_runs/parallel``."""
    while directory not in ("", "/") and os.path.exists(os.path.join(directory, "__init__.py")):
        directory = os.path.dirname(directory)
    return directory


def display_paths(files: Iterable[str]) -> dict:
    """Absolute recorded path -> short display path, for every file given.

    Library files show from their package (``torch/nn/modules/linear.py``); user files inside a
    Python package readable here show from the package's parent (``sample_runs/model.py``);
    others relative to the directory all user files share, or as their last two components."""
    files = sorted(set(files))
    user = [f for f in files if f.startswith("/") and not is_library(f)]
    base = os.path.commonpath([os.path.dirname(f) for f in user]) if user else ""
    out = {}
    for f in files:
        root = _package_root(os.path.dirname(f)) if f.startswith("/") else ""
        if is_library(f):
            out[f] = _library_display(f)
        elif root not in ("", "/") and root != os.path.dirname(f):
            out[f] = f[len(root) + 1:]
        elif base not in ("", "/") and f.startswith(base + "/"):
            out[f] = f[len(base) + 1:]
        else:
            out[f] = "/".join(f.split("/")[-2:]) if f.startswith("/") else f
    return out


@lru_cache(maxsize=512)
def read_source(file: str) -> Optional[list]:
    """Lines of a recorded ``.py`` file if it is readable on this machine, else None."""
    if not file.endswith(".py") or not os.path.isfile(file):
        return None
    try:
        if os.path.getsize(file) > _MAX_SOURCE_BYTES:
            return None
        with open(file, encoding="utf-8", errors="replace") as fh:
            return fh.read().splitlines()
    except OSError:
        return None


@lru_cache(maxsize=512)
def definition_lines(file: str) -> dict:
    """qualname -> line of its ``def``/``class`` in a readable source file ({} otherwise)."""
    lines = read_source(file)
    if lines is None:
        return {}
    try:
        tree = ast.parse("\n".join(lines))
    except (SyntaxError, ValueError):
        return {}
    out = {"<module>": 1}

    def visit(node, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                qualname = prefix + child.name
                out.setdefault(qualname, child.lineno)
                inner = qualname + (".<locals>." if not isinstance(child, ast.ClassDef) else ".")
                visit(child, inner)
            else:
                visit(child, prefix)
    visit(tree, "")
    return out


def definition_line(file: str, qualname: str, fallback: int) -> int:
    """Where ``qualname`` is defined in ``file``; ``fallback`` when the file is not readable."""
    return definition_lines(file).get(qualname, fallback)
