"""Source files of a run: short display paths, definition lines, the files themselves.

Traces store absolute file paths of the recording machine. This module turns them into short
paths for display (``sample_runs/model.py``, ``torch/nn/modules/linear.py``), finds where each
function is defined (by parsing the file with ``ast``, never importing it), and reads the
files for the report's source pages.

What may be read: only the files the recording names *and* whose content here is the content
it saw. The recorder keeps the sha256 and size of every source file its stacks name, with the
root it lies under (the run's working directory, the script's directory, or the ``sys.path`` entry
a package was imported from: ``sources`` in the trace's metadata,
tracer/recorder/process/process_info.py).
:class:`RecordedSources` holds them. Its ``text`` (the report's source pages) and, while it is
active (:func:`reading`), :func:`definition_lines` give a file only if the file found at the
recorded path has that hash, and nothing otherwise (nor with no recording active). So a trace from
someone else that names a local ``secret.py`` gets none of it into a report (matching the hash
means knowing the content already), and a file edited since the run is said to be changed instead
of shown against lines that moved. ``trace-report --no-source`` activates none: no file is read.
"""
from __future__ import annotations

import ast
import hashlib
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Optional

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


def display_paths(files: Iterable[str]) -> dict[str, str]:
    """Absolute recorded path -> short display path, for every file given.

    Library files show from their package (``torch/nn/modules/linear.py``); user files inside a
    Python package readable here show from the package's parent (``sample_runs/model.py``);
    others relative to the directory all user files share, or as their last two components."""
    files = sorted(set(files))
    user = [f for f in files if f.startswith("/") and not is_library(f)]
    base = os.path.commonpath([os.path.dirname(f) for f in user]) if user else ""
    out: dict[str, str] = {}
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


@dataclass(frozen=True)
class SourceText:
    """A recorded file as a report may show it: its ``lines`` (None when not shown), where they
    came from, or why there are none."""

    lines: Optional[list[str]]
    where: str = ""             # "the run's working directory /repo, as pkg/model.py"
    why_not: str = ""           # why no text is shown
    digest: str = ""            # the recorded sha256, shown abbreviated
    size: int = 0


_ROOTS = {"cwd": "the run's working directory", "script": "the script's directory",
          "path": "the directory it was imported from (sys.path)",
          "file": "its own directory"}


class RecordedSources:
    """The source files a recording names with their content hashes (every rank's ``sources``
    metadata), and the text of those whose content here matches."""

    def __init__(self, metas: Iterable[dict[str, Any]]) -> None:
        # path -> {(sha256, size): entry}
        self.recorded: dict[str, dict[tuple[str, int], dict[str, Any]]] = {}
        for meta in metas:
            for path, entry in (meta.get("sources") or {}).items():
                if isinstance(path, str) and isinstance(entry, dict) and \
                        isinstance(entry.get("sha256"), str) and \
                        isinstance(entry.get("size"), int):
                    self.recorded.setdefault(path, {})[(entry["sha256"], entry["size"])] = entry
        self._texts: dict[str, SourceText] = {}
        self._definitions: dict[str, dict[str, int]] = {}

    def text(self, file: str) -> SourceText:
        """``file``'s text if the file at that path has the content the recording saw."""
        if file not in self._texts:
            self._texts[file] = self._check(file)
        return self._texts[file]

    def _check(self, file: str) -> SourceText:
        seen = self.recorded.get(file)
        if not seen:
            return SourceText(None, why_not="the recording holds no content hash of this file "
                              "(not one of its source files, over 2 MB, or recorded by an older "
                              "paratrace), so no file here can be taken for it")
        if not file.endswith(".py") or not os.path.isfile(file):
            return SourceText(None, why_not="no such file on this machine")
        try:
            if os.path.getsize(file) > _MAX_SOURCE_BYTES:
                return SourceText(None, why_not="the file here is over 2 MB")
            with open(file, "rb") as fh:
                data = fh.read(_MAX_SOURCE_BYTES + 1)
        except OSError as exc:
            return SourceText(None, why_not=f"unreadable here ({exc.strerror})")
        entry = seen.get((hashlib.sha256(data).hexdigest(), len(data)))
        if entry is None:
            return SourceText(None, why_not="the file here is not the one the recording saw "
                              "(its content hash differs): it changed since the run")
        under, root = entry.get("under"), entry.get("root")
        where = _ROOTS.get(root, "") if isinstance(root, str) else ""
        if isinstance(under, str) and file.startswith(under.rstrip("/") + "/"):
            where = f"{where} {under}, as {file[len(under.rstrip('/')) + 1:]}"
        return SourceText(data.decode("utf-8", errors="replace").splitlines(), where,
                          digest=entry["sha256"], size=entry["size"])

    def definitions(self, file: str) -> dict[str, int]:
        if file not in self._definitions:
            self._definitions[file] = _definitions(self.text(file).lines)
        return self._definitions[file]


_ACTIVE: Optional[RecordedSources] = None


@contextmanager
def reading(sources: Optional[RecordedSources]) -> Iterator[Optional[RecordedSources]]:
    """Within the block, :func:`definition_lines` reads what ``sources`` allows (None: nothing
    at all, as ``--no-source``)."""
    global _ACTIVE
    before, _ACTIVE = _ACTIVE, sources
    try:
        yield sources
    finally:
        _ACTIVE = before


def definition_lines(file: str) -> dict[str, int]:
    """qualname -> line of its ``def``/``class`` in a readable source file ({} otherwise)."""
    return _ACTIVE.definitions(file) if _ACTIVE is not None else {}


def _definitions(lines: Optional[list[str]]) -> dict[str, int]:
    if lines is None:
        return {}
    try:
        tree = ast.parse("\n".join(lines))
    except (SyntaxError, ValueError):
        return {}
    out = {"<module>": 1}

    def visit(node: ast.AST, prefix: str) -> None:
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
