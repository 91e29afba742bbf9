"""Python stack capture and interning.

By default a stack keeps the user's frames (innermost first, up to ``depth`` of them) plus the
*boundary* frame: the outermost library frame of the innermost run of library frames, i.e. the
library function the user's code called (``torch/nn/modules/linear.py: Linear.forward``).
Library frames between user frames (``Module._call_impl``...) are dropped. paratrace's own frames
are always dropped.

A frame is *library* when its file lies under the interpreter's stdlib or site-packages
directories (or is frozen / generated), unless it lies under a path the user marked as theirs
(paratrace's own sample_runs/ is always the user's: it stands for user code).
"""
from __future__ import annotations

import json
import os
import sys
import sysconfig

USER, LIBRARY, INTERNAL = 2, 1, 0

_HERE = os.path.dirname(os.path.abspath(__file__))
_ROOT = os.path.dirname(_HERE)
_INTERNAL_DIRS = tuple(os.path.join(_ROOT, d) + os.sep for d in ("tracer", "instrument"))
_SAMPLE_RUNS = os.path.join(_ROOT, "sample_runs") + os.sep


# torch's own dispatch and module-call machinery between a call site and the mode: never a
# useful frame (the boundary of a module call is then its forward, e.g. Linear.forward).
_DISPATCH_FILES = ("_compile.py", os.path.join("_dynamo", "eval_frame.py"),
                   os.path.join("utils", "_python_dispatch.py"), "_ops.py",
                   os.path.join("nn", "modules", "module.py"))


# Decorator wrappers: a boundary frame named like this says nothing; the function it wraps
# (the next frame inward) is kept as the boundary instead.
_WRAPPER_NAMES = frozenset({"wrapper", "inner", "_fn", "decorate_context", "wrapped", "_wrapper",
                            "wrapper_fn", "_inner"})


def _dispatch_files() -> tuple:
    try:
        import torch
    except ImportError:  # pragma: no cover
        return ()
    base = os.path.dirname(os.path.abspath(torch.__file__))
    return tuple(os.path.join(base, f) for f in _DISPATCH_FILES)


def _library_dirs() -> tuple:
    dirs = set()
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            dirs.add(os.path.realpath(path) + os.sep)
            dirs.add(os.path.abspath(path) + os.sep)
    for path in sys.path:
        if path and ("site-packages" in path or "dist-packages" in path):
            dirs.add(os.path.abspath(path) + os.sep)
    try:
        import torch
        dirs.add(os.path.dirname(os.path.abspath(torch.__file__)) + os.sep)
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    return tuple(sorted(dirs, key=len, reverse=True))


class StackInterner:
    """Captures the current Python stack and interns it: each unique stack gets one small id."""

    def __init__(self, depth: int = 32, library_frames: bool = False, user_paths=()):
        self.depth = max(1, int(depth))
        self.library_frames = library_frames
        self._lib_dirs = _library_dirs()
        self._dispatch_files = _dispatch_files()
        self._user_dirs = tuple(os.path.abspath(p) + os.sep for p in user_paths) + (_SAMPLE_RUNS,)
        self._kind_of_code: dict = {}
        self._ids: dict = {}        # (code id, f_lasti) tuple -> stack id
        self._text_ids: dict = {}   # stack text -> stack id (several keys share one line)
        self._last_frame = None
        self._last_lasti = -1
        self._last_sid = -1
        self._prev_key: tuple = ()      # the last walk: its key, frames, frame id -> index
        self._prev_frames: list = []
        self._prev_pos: dict = {}
        self._prev_complete = False
        self.values: list = []      # id -> JSON text of [[file, line, function, qualname], ...]

    def classify(self, code) -> int:
        filename = code.co_filename
        path = os.path.abspath(filename) if not filename.startswith("<") else filename
        if path.startswith(_INTERNAL_DIRS) or path in self._dispatch_files:
            kind = INTERNAL
        elif path.startswith(self._user_dirs):
            kind = USER
        elif filename.startswith("<") or path.startswith(self._lib_dirs):
            kind = LIBRARY
        else:
            kind = USER
        # NOTE: keyed by id(code): hashing a code object rehashes its bytecode and constants
        # every time; the code object is kept alive in the value so its id cannot be reused.
        self._kind_of_code[id(code)] = (kind, code)
        return kind

    def capture(self, frame) -> int:
        """Intern the stack that starts at ``frame`` (innermost) and return its id."""
        # NOTE: the key uses f_lasti, not f_lineno: reading f_lineno decodes the line table
        # (microseconds a frame); lines are read only when a new stack is interned.
        kinds = self._kind_of_code
        while frame is not None:                  # skip paratrace's and dispatch frames
            known = kinds.get(id(frame.f_code))
            if (self.classify(frame.f_code) if known is None else known[0]) != INTERNAL:
                break
            frame = frame.f_back
        # NOTE: a live frame's callers are suspended in their calls, so the same frame object
        # at the same instruction has the same stack as last time (every backward op shares
        # the frame that called loss.backward(); F.linear's t and addmm share theirs). The
        # reference to the last frame is dropped at the next op.
        if frame is self._last_frame and frame is not None \
                and frame.f_lasti == self._last_lasti:
            return self._last_sid
        first = frame
        key = []
        frames = []
        boundary = None
        users = 0
        depth = self.depth
        keep_library = self.library_frames
        prev_pos = self._prev_pos
        complete = True
        while frame is not None:
            code = frame.f_code
            known = kinds.get(id(code))
            kind = self.classify(code) if known is None else known[0]
            if kind == USER or (keep_library and kind == LIBRARY):
                if boundary is not None:
                    key.append((id(boundary.f_code), boundary.f_lasti))
                    frames.append(boundary)
                    boundary = None
                # NOTE: the frames of the previous walk are held until this one ends, so a
                # frame found among them at the same instruction is the same frame with the
                # same (suspended) callers: splice the previous walk's outer part.
                i = prev_pos.get(id(frame))
                if i is not None and self._prev_frames[i] is frame \
                        and self._prev_key[i][1] == frame.f_lasti:
                    room = depth - users
                    key.extend(self._prev_key[i:i + room])
                    frames.extend(self._prev_frames[i:i + room])
                    complete = len(self._prev_key) - i <= room and self._prev_complete
                    break
                key.append((id(code), frame.f_lasti))
                frames.append(frame)
                users += 1
                if users >= depth:
                    complete = frame.f_back is None
                    break
            elif kind == LIBRARY and not key and (boundary is None
                                                  or code.co_name not in _WRAPPER_NAMES):
                boundary = frame
            frame = frame.f_back
        if boundary is not None:   # only library frames: keep the outermost one
            key.append((id(boundary.f_code), boundary.f_lasti))
            frames.append(boundary)
        key = tuple(key)
        sid = self._ids.get(key)
        if sid is None:
            text = _encode(frames)
            sid = self._text_ids.get(text)
            if sid is None:
                sid = self._text_ids[text] = len(self.values)
                self.values.append(text)
            self._ids[key] = sid
        self._last_frame, self._last_lasti, self._last_sid = first, \
            (first.f_lasti if first is not None else -1), sid
        # only a walk that reached the outermost frame can lend its tail to the next one
        self._prev_complete = complete
        self._prev_key, self._prev_frames = key, frames
        self._prev_pos = {id(f): i for i, f in enumerate(frames)} if complete else {}
        return sid

    def release(self) -> None:
        """Drop the references to the frames of the last walk (end of recording)."""
        self._last_frame = None
        self._prev_key, self._prev_frames, self._prev_pos = (), [], {}


def _encode(frames) -> str:
    return json.dumps([[f.f_code.co_filename, f.f_lineno, f.f_code.co_name,
                        getattr(f.f_code, "co_qualname", f.f_code.co_name)] for f in frames],
                      separators=(",", ":"))


def decode_stack(text: str) -> tuple:
    """JSON stack text -> tuple of (file, line, function, qualname), innermost first."""
    return tuple(tuple(frame) for frame in json.loads(text))
