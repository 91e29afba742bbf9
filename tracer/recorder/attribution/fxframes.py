"""Frames of code torch.fx runs, mapped back to the source lines of the model it traced.

torch.fx runs a traced model either as generated Python (a GraphModule's ``forward``, compiled
from text under a file name like ``<eval_with_key>.3``) or node by node in
``torch.fx.Interpreter.run_node`` (torch.export's unflattened modules, from which
torch.distributed.pipelining's ``pipeline()`` builds its stages). Either way the frames say
nothing of the model: generated code is a ``<...>`` file, the interpreter is torch. The graph's
nodes remember where tracing met them: ``node.meta["stack_trace"]``, the traceback from the
traced module's forward down to the call the node stands for (torch.export, Dynamo, fx.Tracer
with ``record_stack_traces``), e.g. ``Model.forward`` -> ``Block.forward`` -> torch's
``Linear.forward``.

tracer.recorder.attribution.stacks asks this module for those frames once per call-site node it
makes (never per op) and puts them in the stack in place of the FX frame. Torch is imported only by
:class:`FxFrames` (the recorder's side).
"""
from __future__ import annotations

import re
from typing import Optional

from . import qualnames

GENERATED_PREFIX = "<eval_with_key>"       # torch.fx.graph_module's file names of generated code
_TRACE_LINE = re.compile(r'^\s*File "(.+)", line (\d+), in (.+?)\s*$')


class FxFrames:
    """Which frames run FX graphs, and the source frames their nodes recorded."""

    def __init__(self):
        try:
            from torch.fx import Interpreter, Node
        except ImportError:                   # pragma: no cover - a torch without torch.fx
            Interpreter, Node = None, ()
        run_node = getattr(Interpreter, "run_node", None)
        # NOTE: by identity: hashing a code object rehashes its bytecode
        # (tracer.recorder.attribution.stacks)
        self.run_node_code = getattr(run_node, "__code__", None)
        self._node_type = Node
        self._graphs: dict = {}       # id(generated code) -> (code, nodes, lineno map) or None
        self._origins: dict = {}      # stack_trace text -> its frames

    @staticmethod
    def is_generated(code) -> bool:
        """``code`` is a GraphModule's generated forward."""
        return code.co_filename.startswith(GENERATED_PREFIX)

    def node_of(self, frame, interpreted: bool):
        """The graph node ``frame`` runs: the one ``Interpreter.run_node`` was given
        (``interpreted``), or the one of the generated line the frame is at; None if unknown."""
        try:
            if interpreted:
                node = frame.f_locals.get("n")
                return node if isinstance(node, self._node_type) else None
            graph = self._graph(frame)
        except Exception:     # a frame whose locals cannot be read: the frame stays as it is
            return None
        if graph is None:
            return None
        code, nodes, lineno_map = graph
        # torch's own mapping (Dynamo's _maybe_preserve_original_meta): lines counted from
        # the generated forward's first line
        index = lineno_map.get(frame.f_lineno - code.co_firstlineno)
        return nodes[index] if isinstance(index, int) and 0 <= index < len(nodes) else None

    def _graph(self, frame):
        """(code, graph nodes in order, generated line -> node index) of a generated forward's
        frame, found once per code object (its GraphModule: ``self``, or the ``graph_module``
        of the InterpreterModule that runs it as generated code)."""
        code = frame.f_code
        known = self._graphs.get(id(code), False)
        if known is not False:
            return known
        # NOTE: reading f_locals copies the frame's locals on Python < 3.13 (until it returns):
        # done once per generated forward, not per line
        owner = frame.f_locals.get("self")
        graph = None
        for module in (owner, getattr(owner, "__dict__", {}).get("graph_module")):
            forward = getattr(type(module), "forward", None)
            lineno_map = getattr(module, "_lineno_map", None)
            if getattr(forward, "__code__", None) is code and isinstance(lineno_map, dict):
                graph = (code, list(module.graph.nodes), lineno_map)
                break
        self._graphs[id(code)] = graph     # holds the code: its id is not reused
        return graph

    def origin(self, node) -> tuple:
        """The frames ``node`` recorded, outermost first: ((file, line, function, qualname),
        ...); () when it recorded none."""
        meta = getattr(node, "meta", None)
        text = meta.get("stack_trace") if isinstance(meta, dict) else None
        if not isinstance(text, str) or not text:
            return ()
        frames = self._origins.get(text)
        if frames is None:
            frames = self._origins[text] = tuple(
                (path, int(line), name, self.qualname(path, int(line), name))
                for path, line, name in (m.groups() for m in map(_TRACE_LINE.match,
                                                                  text.splitlines()) if m))
        return frames

    def qualname(self, path: str, line: int, name: str) -> str:
        """The qualified name (``Block.forward``) of the function ``name`` whose body holds
        ``line`` of ``path``, as tracer.recorder.attribution.qualnames names a live frame's;
        ``name`` when the source cannot tell."""
        best = None
        for d in qualnames.definitions(path):
            if d.kind == qualnames.FUNCTION and d.name == name and d.first <= line <= d.last \
                    and (best is None or d.first >= best.first):
                best = d
        return best.qualname if best is not None else name


def enclosing_strip(origin: tuple, outer: Optional[tuple]) -> tuple:
    """``origin`` without the frames an enclosing FX frame's origin ``outer`` already stands
    for (a nested graph's node repeats its caller's frames first)."""
    if outer and origin[:len(outer)] == outer:
        return origin[len(outer):]
    return origin
