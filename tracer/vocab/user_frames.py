"""Which frames of a Python stack a person is shown: the user's, and the boundary call into a
library, never paratrace's own. One rule for the stacks the recorder keeps
(tracer.recorder.attribution.stacks), the traceback a worker prints when its script raises
(instrument.launch.bootstrap) and the stacks the report shows of a hung run (viz.views.failures):
a worker's error then reads as the user's code calling torch, not as runpy, trace-run's
bootstrap and the recorder's wrappers (``comm.py``) failing.

- paratrace's frames (``tracer/``, ``instrument/``, ``viz/``) and torch's dispatch and
  module-call machinery (:data:`DISPATCH_FILES`) are *internal*: never kept;
- the user's frames (:class:`tracer.vocab.library.LibraryRule`) are kept, up to a depth;
- of the innermost run of library frames, the outermost is the *boundary*, the library function
  the user's code called (``torch/distributed/distributed_c10d.py: all_reduce``); a decorator's
  wrapper (:data:`WRAPPER_NAMES`) there gives way to the function it wraps; library frames
  between user frames (runpy, ``Module._call_impl``) are dropped. A stack of library frames
  only keeps its outermost.

Torch-free: viz reads stacks without torch.
"""
from __future__ import annotations

import os
import re
import types
from typing import Any, Iterable, Optional

from .library import ROOT, LibraryRule

# a frame's kind (tracer/recorder/csrc/hotpath/stackwalk.c mirrors the values)
INTERNAL, LIBRARY, USER, FX_NODE = 0, 1, 2, 3
# torch's own dispatch and module-call machinery between a call site and the mode, relative to
# torch's directory: never a useful frame (the boundary of a module call is then its forward,
# e.g. Linear.forward)
DISPATCH_FILES = ("_compile.py", os.path.join("_dynamo", "eval_frame.py"),
                  os.path.join("utils", "_python_dispatch.py"), "_ops.py",
                  os.path.join("nn", "modules", "module.py"))
# Decorator wrappers: a boundary frame named like this says nothing; the function it wraps
# (the next frame inward) is kept as the boundary instead.
WRAPPER_NAMES = frozenset({"wrapper", "inner", "_fn", "decorate_context", "wrapped", "_wrapper",
                           "wrapper_fn", "_inner"})
# a frame: (file, line, function, ...), what follows is the caller's (a traceback entry...)
Frame = tuple[Any, ...]
PARATRACE_DIRS = tuple(os.path.join(ROOT, d) + os.sep for d in ("tracer", "instrument", "viz"))
_TORCH_DISPATCH = tuple(os.sep + os.path.join("torch", f) for f in DISPATCH_FILES)


def kept(chain: Iterable[tuple[int, Frame]], depth: int, library_frames: bool = False
         ) -> list[Frame]:
    """The frames a stack keeps, innermost first, from ``chain``: (kind, frame) innermost
    first: the user's (library ones too with ``library_frames``), up to ``depth`` of them, and
    the boundary call into a library."""
    out: list[Frame] = []
    boundary = None
    users = 0
    for kind, entry in chain:
        if kind == USER or (library_frames and kind == LIBRARY):
            if boundary is not None:
                out.append(boundary)
                boundary = None
            out.append(entry)
            users += 1
            if users >= depth:
                break
        elif kind == LIBRARY and not out and (boundary is None
                                              or entry[2] not in WRAPPER_NAMES):
            boundary = entry
        elif kind == FX_NODE and not out:
            boundary = None       # the interpreter's call_function...: its machinery
    if boundary is not None:      # only library frames: keep the outermost one
        out.append(boundary)
    return out


def kind_of(path: str, rule: LibraryRule) -> int:
    """A frame's kind by its file alone (no code object: a traceback, a faulthandler dump)."""
    if not path.startswith("<"):
        path = os.path.abspath(path)
        if path.startswith(PARATRACE_DIRS) or path.endswith(_TORCH_DISPATCH):
            return INTERNAL
    return LIBRARY if rule.is_library(path) else USER


def trim(frames: list[Frame], rule: LibraryRule, depth: int = 64) -> list[Frame]:
    """``frames`` outermost first, each ``(file, line, function, ...)``: the kept ones,
    outermost first."""
    chain = [(kind_of(f[0], rule), f) for f in reversed(frames)]
    return list(reversed(kept(chain, depth)))


def trim_traceback(exc: BaseException, rule: LibraryRule) -> BaseException:
    """``exc`` with its traceback, and its causes' and contexts', cut to the frames the rule
    keeps: printed by ``sys.excepthook`` (torch's prefixes each line with ``[rankN]:``) it reads
    as Python's, without runpy's, trace-run's and the recorder's frames."""
    seen: set[int] = set()
    link: Optional[BaseException] = exc
    while link is not None and id(link) not in seen:
        seen.add(id(link))
        entries = []
        tb = link.__traceback__
        while tb is not None:
            entries.append(tb)
            tb = tb.tb_next
        code = [tb.tb_frame.f_code for tb in entries]
        shown = trim([(c.co_filename, tb.tb_lineno, c.co_name, tb)
                      for c, tb in zip(code, entries)], rule)
        new = None
        for *_, tb in reversed(shown):
            new = types.TracebackType(new, tb.tb_frame, tb.tb_lasti, tb.tb_lineno)
        link.__traceback__ = new
        link = link.__cause__ if link.__cause__ is not None else \
            (None if link.__suppress_context__ else link.__context__)
    return exc


_THREAD = re.compile(r"^(Thread 0x[0-9a-f]+|Current thread 0x[0-9a-f]+|Stack)")
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]*)", line (?P<line>\d+) in (?P<name>.*)$')


def trim_dump(text: str, rule: Optional[LibraryRule]) -> str:
    """A faulthandler dump (``Thread 0x... (most recent call first):`` and its ``File "f",
    line N in name`` lines, innermost first) with each thread's frames trimmed by the rule;
    without a rule, as it is."""
    if rule is None:
        return text
    out: list[str] = []
    frames: list[Frame] = []

    def flush() -> None:
        chain = [(kind_of(f[0], rule), f) for f in frames]
        out.extend(f[3] for f in kept(chain, 64))
        frames.clear()
    for line in text.splitlines():
        match = _FRAME.match(line)
        if match:
            frames.append((match["file"], int(match["line"]), match["name"], line))
            continue
        flush()
        out.append(line)
    flush()
    return "\n".join(out)
