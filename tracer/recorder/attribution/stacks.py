"""Python stack capture and interning.

By default a stack keeps the user's frames (innermost first, up to ``depth`` of them) plus the
*boundary* frame: the outermost library frame of the innermost run of library frames, i.e. the
library function the user's code called (``torch/nn/modules/linear.py: Linear.forward``).
Library frames between user frames (``Module._call_impl``...) are dropped. paratrace's own frames
are always dropped.

A frame is *library* by the recording's :class:`tracer.vocab.library.LibraryRule`: by default
torch, the standard library and frozen / generated code; every other package, installed or not, is
the user's (transformers' modeling code, Lightning). Paths the user marked as theirs are, and
paratrace's own sample_runs/ always is: it stands for user code.

Code torch.fx runs (a GraphModule's generated forward, ``torch.fx.Interpreter.run_node``) is
replaced by the frames its graph node recorded when it was traced
(tracer.recorder.attribution.fxframes): the model's own lines, as if it had run eagerly. That is
decided once per call-site node, off the hot path; the walk only keys an interpreter's frames by the
node they run.
"""
from __future__ import annotations

import json
import os

from tracer.vocab.library import ROOT as _ROOT, LibraryRule
from tracer.vocab.user_frames import (DISPATCH_FILES as _DISPATCH_FILES, FX_NODE, INTERNAL,
                                      LIBRARY, USER, kept)

from ..hotpath._native import native_hot_path
from . import qualnames
from .fxframes import FxFrames, enclosing_strip

# The frame kinds (tracer.vocab.user_frames: USER, LIBRARY, INTERNAL). FX_NODE:
# torch.fx.Interpreter.run_node, one code for every graph node it runs, so the walk keys its
# frames by that node too (_fx_siblings); a node of this kind drops the interpreter's frames
# inward of it. NOTE: tracer/recorder/csrc/hotpath/stackwalk.c's FX_NODE

_INTERNAL_DIRS = tuple(os.path.join(_ROOT, d) + os.sep for d in ("tracer", "instrument"))
_SAMPLE_RUNS = os.path.join(_ROOT, "sample_runs") + os.sep


# inspect.CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR (inspect is slow to import, and
# readers of traces import this module)
_RESUMABLE = 0x20 | 0x80 | 0x200


def _dispatch_files() -> tuple:
    try:
        import torch
    except ImportError:  # pragma: no cover
        return ()
    base = os.path.dirname(os.path.abspath(torch.__file__))
    return tuple(os.path.join(base, f) for f in _DISPATCH_FILES)


class _PyStackWalk:
    """StackInterner's hot path in Python: the twin of tracer/recorder/csrc/hotpath/'s StackWalk,
    which replaces it where the extension is built. Both work on the subclass's tables (set up in
    its __init__) and call back its classify, _new_node, _sid and _root off the hot path.

    NOTE: two threads that record share the tables. A stack id is always right (a node's stack
    is its own parent chain, whatever the path holds), so a capture sets the last-capture state
    in one step at its end, and a path index that another thread's capture made stale sends
    the walk back to an empty path rather than into an IndexError."""

    def capture(self, frame) -> int:
        """Intern the stack that starts at ``frame`` (innermost) and return its id.

        Hot path. The same frame as the last capture's (the next op of the same function)
        costs an identity test, or a lookup by instruction when it moved on; otherwise the
        frames are walked only up to the first one that did not change since the last capture.
        """
        if frame is self._last_start:
            lasti = frame.f_lasti
            if lasti == self._last_lasti or self._last_entry is None:
                # the same instruction (e.g. every op of one loss.backward()), or a dispatch
                # frame: the stack is its callers', which cannot change while it lives
                return self._last_sid
            # the same function, a later instruction: _move, inline (half of all captures)
            entry = self._last_entry
            node = entry[3].get(lasti)
            if node is None:
                node = self._new_node(entry[4], frame, lasti, entry[3])
            entry[1], entry[2] = lasti, node
            sid = self._node_sid[node]
            if sid < 0:
                sid = self._sid(node)
            if self._last_entry is entry:
                self._last_lasti, self._last_sid = lasti, sid
            return sid
        at = self._path_pos.get(frame)
        if at is None:
            return self._walk(frame)
        # a function on the last stack (a call it made returned): the frames it called go
        if at < len(self._path):
            self._drop_after(at)
        if at >= len(self._path):                     # see the class's note
            self.release()
            return self._walk(frame)
        entry = self._path[at]
        lasti = frame.f_lasti
        sid = self._sid(self._move(entry, frame, lasti))
        self._last_start, self._last_lasti, self._last_entry, self._last_sid = \
            frame, lasti, entry, sid
        return sid

    def _move(self, entry: list, frame, lasti: int) -> int:
        """The node of the path entry of ``frame``, now at ``lasti`` (the entry follows it)."""
        if entry[1] != lasti:
            node = entry[3].get(lasti)
            if node is None:
                node = self._new_node(entry[4], frame, lasti, entry[3])
            entry[1], entry[2] = lasti, node
        return entry[2]

    def _walk(self, start) -> int:
        kinds = self.kind_of_code
        frame = start
        while frame is not None:                  # skip paratrace's and dispatch frames
            known = kinds.get(id(frame.f_code)) or self.classify(frame.f_code)
            if known[0] != INTERNAL:
                break
            frame = frame.f_back
        if frame is None:
            sid = self._root()
            self._last_start, self._last_sid = None, sid
            return sid
        # NOTE: nodes are keyed by f_lasti, not f_lineno: reading f_lineno decodes the line
        # table (microseconds a frame); lines are read only when a node is made.
        path = self._path
        pos = self._path_pos
        changed = []                              # kept frames not on the path, innermost first
        f = frame
        node = -1
        innermost = None                          # the path entry of ``frame``, once known
        while True:                               # up to the first frame on the path
            at = pos.get(f)
            if at is not None:                    # the same live frame: its callers are too
                if at >= len(path):               # see the class's note
                    self.release()
                    return self._walk(start)
                innermost = path[at]
                node = self._move(innermost, f, f.f_lasti)
                break
            if known[0] != INTERNAL:
                changed.append(f)
            f = f.f_back
            if f is None:
                at = -1
                break
            known = kinds.get(id(f.f_code)) or self.classify(f.f_code)
        self._drop_after(at)
        siblings = self._siblings
        for f in reversed(changed):
            code_id = id(f.f_code)
            if kinds[code_id][0] == FX_NODE:
                lastis = self._fx_siblings(node, f)
            else:
                lastis = siblings.get((node, code_id))
                if lastis is None:
                    lastis = siblings[(node, code_id)] = {}
            lasti = f.f_lasti
            parent = node
            node = lastis.get(lasti)
            if node is None:
                node = self._new_node(parent, f, lasti, lastis)
            if not kinds[code_id][1]:
                # NOTE: a generator's frame is never looked up: another caller may resume it
                pos[f] = len(path)
            innermost = [f, lasti, node, lastis, parent]
            path.append(innermost)
        resumable = kinds[id(start.f_code)][1] or kinds[id(frame.f_code)][1]
        sid = self._sid(node)
        self._last_start, self._last_lasti, self._last_entry, self._last_sid = (
            None if resumable else start, start.f_lasti,
            innermost if frame is start else None, sid)
        return sid

    def _drop_after(self, at: int) -> None:
        """Forget the path's frames inward of index ``at`` (-1: all of them)."""
        path = self._path
        if len(path) > at + 1:
            for gone in path[at + 1:]:
                self._path_pos.pop(gone[0], None)
            del path[at + 1:]


class _Interning:
    """Captures the current Python stack and interns it: each unique stack gets one small id.

    Call sites form a tree: a node is a frame's (code, instruction) under its caller's node, so
    a node stands for the whole stack from the outermost frame down to it. The stack id of a
    node (its kept frames as JSON, interned) is computed once, when the node is made. A capture
    only walks the frames that changed since the last one: the frames of the last capture are
    held (the *path*) until the next, and a frame found on the path at the same instruction is
    the same frame, suspended in the same call, so everything outward of it is unchanged.

    This class holds the tables and everything off the hot path; the hot path (``capture``)
    is its base's: StackInterner's is C where the extension is built, PyStackInterner's Python.
    """

    def __init__(self, depth: int = 32, library_frames: bool = False, user_paths=(),
                 library=()):
        self.depth = max(1, int(depth))
        self.library_frames = library_frames
        self.rule = LibraryRule.build(library, user_paths, always_user=(_SAMPLE_RUNS,))
        self._dispatch_files = _dispatch_files()
        self.kind_of_code: dict = {}   # id(code) -> (kind, resumable, code)
        self._siblings: dict = {}       # (parent node, id(code)) -> {f_lasti: node}
        self._node_parent: list = []    # node -> parent node, -1 for the outermost frame
        self._node_frame: list = []     # node -> (kind, [file, line, function, qualname])
        self._node_sid: list = []       # node -> stack id, -1 until an op is issued there
        self._text_ids: dict = {}       # stack text -> stack id (several nodes share one)
        self._root_sid = -1             # stack id of a stack with no frame kept at all
        self._fx = FxFrames()
        self._generated: set = set()    # id(code) of GraphModules' generated forwards
        self._fx_origins: dict = {}     # node of an FX frame -> the frames it stands for
        # the last capture's kept frames, outermost first: [frame, f_lasti, node, the
        # {f_lasti: node} of its code under its caller, its caller's node]
        self._path: list = []
        self._path_pos: dict = {}       # frame -> index in the path (frames hash by identity)
        # the frame the last capture started from (held, so it cannot be another frame at the
        # same address; None: a generator's, which another caller may resume), its
        # instruction then, its path entry (None: it was one of paratrace's or torch's dispatch
        # frames, and the stack is its callers', which cannot change while it lives), and the
        # stack id
        self._last_start = None
        self._last_lasti = -1
        self._last_entry = None
        self._last_sid = -1
        self.values: list = []      # id -> JSON text of [[file, line, function, qualname], ...]

    def classify(self, code) -> tuple:
        kind = self._kind_of_file(code.co_filename)
        if code is self._fx.run_node_code:
            kind = FX_NODE
        elif kind == LIBRARY and self._fx.is_generated(code):
            self._generated.add(id(code))
        # NOTE: keyed by id(code): hashing a code object rehashes its bytecode and constants
        # every time; the code object is kept alive in the value so its id cannot be reused.
        # A generator or coroutine frame can be resumed by another caller at the same
        # instruction, so it never vouches for the frames outward of it.
        known = self.kind_of_code[id(code)] = (kind, bool(code.co_flags & _RESUMABLE), code)
        return known

    def _kind_of_file(self, filename: str) -> int:
        path = os.path.abspath(filename) if not filename.startswith("<") else filename
        if path.startswith(_INTERNAL_DIRS) or path in self._dispatch_files:
            return INTERNAL
        return LIBRARY if self.rule.is_library(path) else USER

    def _sid(self, node: int) -> int:
        if node < 0:
            return self._root()
        sid = self._node_sid[node]
        if sid < 0:                       # the first op issued at this node
            sid = self._node_sid[node] = self._intern(self._kept_frames(node))
        return sid

    def _new_node(self, parent: int, frame, lasti: int, lastis: dict) -> int:
        code = frame.f_code
        kind = self.kind_of_code[id(code)][0]
        origin = None
        if kind == FX_NODE or id(code) in self._generated:
            try:
                parent, kind, origin = self._fx_frames(parent, frame, kind == FX_NODE)
            except Exception:     # a graph's odd metadata: the frame stays as it is
                kind = LIBRARY
        node = lastis[lasti] = len(self._node_parent)
        self._node_parent.append(parent)
        self._node_frame.append((kind, [
            code.co_filename, frame.f_lineno, code.co_name,
            qualnames.of_code(code)]))
        self._node_sid.append(-1)
        if origin:
            self._fx_origins[node] = origin
        return node

    def _fx_frames(self, parent: int, frame, interpreted: bool) -> tuple:
        """(parent, kind, origin) of the node of a frame running FX code: under nodes for the
        frames its graph node recorded (origin, outermost first; those an enclosing FX frame
        stands for already left out), itself seen through (INTERNAL: generated code; FX_NODE:
        the interpreter, whose frames inward of it are its own machinery); a library frame
        when the node recorded nothing."""
        origin = self._fx.origin(self._fx.node_of(frame, interpreted))
        if not origin:
            return parent, LIBRARY, None
        outer, up = None, parent
        while up >= 0 and outer is None:
            outer = self._fx_origins.get(up)
            up = self._node_parent[up]
        for path, line, name, qualname in enclosing_strip(origin, outer):
            node = len(self._node_parent)
            self._node_parent.append(parent)
            self._node_frame.append((self._kind_of_file(path), [path, line, name, qualname]))
            self._node_sid.append(-1)
            parent = node
        return parent, FX_NODE if interpreted else INTERNAL, origin

    def _fx_siblings(self, parent: int, frame) -> dict:
        """The {f_lasti: node} table of an interpreter's ``run_node`` frame under ``parent``:
        one per graph node it runs (its code and instruction are the same for all of them)."""
        key = (parent, id(frame.f_code), self._fx.node_of(frame, True))
        table = self._siblings.get(key)
        if table is None:
            table = self._siblings[key] = {}
        return table

    def _kept_frames(self, node: int) -> list:
        """The frames a stack keeps, innermost first: the user's (library ones too with
        library_frames), up to ``depth``, and the boundary call into a library
        (tracer.vocab.user_frames.kept)."""
        chain = []
        while node >= 0:
            chain.append(self._node_frame[node])
            node = self._node_parent[node]
        return kept(chain, self.depth, self.library_frames)

    def _intern(self, frames: list) -> int:
        text = json.dumps(frames, separators=(",", ":"))
        sid = self._text_ids.get(text)
        if sid is None:
            sid = self._text_ids[text] = len(self.values)
            self.values.append(text)
        return sid

    def empty(self) -> int:
        """The id of the empty stack: an op no Python frame called (on autograd's device
        threads, which run CUDA backward ops, the mode's dispatch is the outermost frame)."""
        return self._root()

    def _root(self) -> int:
        if self._root_sid < 0:
            self._root_sid = self._intern([])
        return self._root_sid

    def release(self) -> None:
        """Drop the references to the frames of the last capture (end or pause of recording)."""
        self._last_start = self._last_entry = None
        self._path, self._path_pos = [], {}


class PyStackInterner(_Interning, _PyStackWalk):
    """A StackInterner whose hot path is Python (tests; where the C extension is not built)."""

    HOT_PATH = "python"


_StackWalk = getattr(native_hot_path(), "StackWalk", _PyStackWalk)


class StackInterner(_Interning, _StackWalk):
    """The stack interner the recorder uses: the C hot path where it is built, else Python's."""

    HOT_PATH = "python" if _StackWalk is _PyStackWalk else "c"    # the trace's meta says it
