"""torch.compile under the recorder: compiled code runs compiled, and each call of a compiled
region is recorded as an annotation range (docs/phases.md#torchcompile).

Dynamo skips every frame while a TorchDispatchMode whose ``ignore_compile_internals()`` is
False is on the stack, so a plain mode turns ``torch.compile(model)`` into the eager program.
The recording mode answers True (``_mode.py``) unless the trace asks for ``compiled="eager"``:
Dynamo then compiles with the mode off the stack and runs the compiled code with it on, so the
mode sees what that code dispatches (extern kernels such as ``aten.addmm.out``, fallbacks,
functional collectives and their waits), not the fused kernels (on a GPU the device recorder
sees those).

What this module adds while recording (tracer/recorder/patches/dynamo.py wires it into Dynamo):

- every graph a backend compiles (Dynamo's ``OutputGraph.call_user_compiler``) is wrapped: a
  call is an annotation range labelled ``torch.compile`` with attributes ``{"source":
  "torch.compile", "graph": "<frame>/<recompile>", "code": "file:line", "fn": name, "backend",
  "module", "pass": "forward"}``; the backward of that call (the ``CompiledFunctionBackward``
  node of its outputs, AOTAutograd backends) is a second range with ``"pass": "backward"``,
  from hooks on that node;
- the module hooks return at once while Dynamo traces (modules.py): Dynamo inlines them as
  nothing instead of failing on, or graph-breaking at, their bookkeeping; inside compiled code
  ops carry the module that called the compiled region. Called as frames of their own (a
  compiled module's ``__call__`` runs eagerly and calls them), Dynamo never compiles them nor
  what they call (:func:`prepare`);
- Dynamo's compilation of a frame runs with the dispatch modes off the stack on every path,
  DDP's included (:func:`without_modes`): its tracing on fake tensors is never recorded;
- ``OptimizedModule.__call__`` without its warning about global module hooks: the warning says
  the hooks fire for the wrapper and again for the wrapped module; the module tracker names the
  wrapper as the module it wraps (modules.py), so that is harmless here.
"""
from __future__ import annotations

import weakref
from time import perf_counter_ns as _now

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..attribution import qualnames
from ..compat import skip_dynamo

LABEL = "torch.compile"


# NOTE: TorchDispatchMode.ignore_compile_internals came with torch 2.9 (pytorch#161648); before
# it Dynamo skips every frame while any such mode is active, whatever the mode answers
SUPPORTED = hasattr(TorchDispatchMode, "ignore_compile_internals")


def prepare(session, modules, compiled: bool) -> None:
    """Before recording: say what really runs where compiled code cannot run compiled, and
    mark the module hooks for Dynamo (the patches: tracer/recorder/patches/dynamo.py)."""
    if compiled and not SUPPORTED:      # say what really runs: the eager program
        session.flusher.merge_meta("options", {
            "compiled": "eager", "compiled_why": f"torch {torch.__version__} runs compiled "
            "code eagerly under any dispatch mode (torch >= 2.9 runs it compiled)"})
    _run_frames_eagerly(type(modules).pre_forward, type(modules).post_forward)


def _run_frames_eagerly(*functions) -> None:
    """Dynamo never runs a call of these, nor anything they call, as a frame of its own
    (compat.skip_dynamo); inlined into a traced frame they still are, and return at once there
    (modules.py). A compiled module's ``_call_impl`` runs eagerly (Dynamo skips torch.nn's
    frames) and calls the global hooks with Dynamo's frame callback set: without this mark
    Dynamo compiled ``ModuleTracker._name`` as a frame, and failed on the module tree it walks
    (``UnspecializedNNModuleVariable ... already tracked for mutation``), or cached it traced,
    a no-op, for every later call. (Before torch 2.7 only the hook's own frame is marked;
    there Dynamo compiles nothing while the recorder's mode is on the stack: SUPPORTED.)"""
    for fn in functions:
        skip_dynamo(fn.__code__)


def without_modes(compile_frame):
    """``compile_frame`` (Dynamo's ``convert_frame._compile``) run with every dispatch mode off
    the stack, as Dynamo runs it itself, except on the path it takes for a module that
    DistributedDataParallel runs (DDPOptimizer: ``compile(DDP(m))``, ``DDP(compile(m))``).
    There Dynamo left the modes on: the recorder saw its tracing on fake tensors (``aten.empty``,
    ``prim.device``, every op of the model on FakeTensors) as the user's forward."""
    from torch.utils._python_dispatch import _disable_current_modes

    def compile_unrecorded(*args, **kwargs):
        if "skip" in kwargs:      # the frames Dynamo's logs skip to reach the user's: one more
            kwargs["skip"] += 1
        with _disable_current_modes():
            return compile_frame(*args, **kwargs)
    return compile_unrecorded


def region_of(session, modules, compiled_fn, graph):
    """What Dynamo runs for a graph a backend compiled (``OutputGraph.call_user_compiler``'s
    result): a :class:`Region` that records each call; ``compiled_fn`` itself when that
    fails (the recorder never breaks a compilation)."""
    try:
        return Region(session, modules, _forward_of(compiled_fn), _describe(graph))
    except Exception:
        return compiled_fn


def _forward_of(compiled_fn):
    """What Dynamo would run: a lazy GraphModule is recompiled now (as Dynamo does when it
    sees one, which it no longer can once wrapped)."""
    from torch.fx._lazy_graph_module import _LazyGraphModule
    owner = getattr(compiled_fn, "__self__", None)
    if isinstance(compiled_fn, _LazyGraphModule) or (
            isinstance(owner, _LazyGraphModule)
            and getattr(compiled_fn, "__name__", "") == "_lazy_forward"):
        lazy = compiled_fn if isinstance(compiled_fn, _LazyGraphModule) else owner
        _LazyGraphModule.force_recompile(lazy)
        if not isinstance(compiled_fn, _LazyGraphModule):
            compiled_fn = lazy.forward
    return compiled_fn


def _backend_name(fn) -> str:
    """A backend's name; DDPOptimizer's (DDP's module compiled: Dynamo splits its graph at
    the gradient buckets and compiles each piece with the user's backend) names that too:
    ``ddp_optimizer(inductor)``."""
    owner = getattr(fn, "__self__", None)
    inner = getattr(owner, "backend_compile_fn", None)
    if type(owner).__name__ == "DDPOptimizer" and inner is not None:
        return f"ddp_optimizer({_backend_name(inner)})"
    return str(getattr(fn, "compiler_name", None) or getattr(fn, "__name__", None) or
               type(fn).__name__)


def _describe(graph) -> dict:
    code = graph.root_tx.f_code
    backend = _backend_name(graph.compiler_fn)
    return {"source": LABEL, "graph": str(getattr(graph, "dynamo_compile_id", "?")),
            "code": f"{code.co_filename}:{code.co_firstlineno}", "fn": qualnames.of_code(code),
            "backend": str(backend)}


class Region:
    """A compiled graph that records each of its calls as a range."""

    def __init__(self, session, modules, fn, attrs: dict):
        # NOTE: Dynamo keeps the graph after the trace ends: it must not keep the session alive
        self._session, self._modules = weakref.ref(session), weakref.ref(modules)
        self._fn, self._attrs = fn, attrs

    def __getattr__(self, name):     # what Dynamo or a backend reads on the function it called
        fn = self.__dict__.get("_fn")
        # NOTE: not the function a Dynamo wrapper stands for: torch 2.10's disable() follows
        # that attribute down to the innermost function, and would run it without the region
        if fn is None or name == "_torchdynamo_orig_callable":
            raise AttributeError(name)
        return getattr(fn, name)

    def __call__(self, *args, **kwargs):
        session, modules = self._session(), self._modules()
        if session is None or modules is None or session.passthrough or not session.is_open:
            return self._fn(*args, **kwargs)
        attrs = dict(self._attrs, module=modules.path, **{"pass": "forward"})
        entry, t0 = session.open_range(LABEL, attrs), _now()
        try:
            out = self._fn(*args, **kwargs)
        finally:
            session.close_range(entry, t0)
        _hook_backward(session, out, dict(attrs, **{"pass": "backward"}))
        return out


def _hook_backward(session, out, attrs: dict) -> None:
    """A range around the backward of this call: hooks on its outputs' compiled node."""
    nodes = {}
    for t in (out if isinstance(out, (list, tuple)) else (out,)):
        node = getattr(t, "grad_fn", None) if isinstance(t, torch.Tensor) else None
        if node is not None and "CompiledFunction" not in node.name():
            node = next((n for n, _ in node.next_functions
                         if n is not None and "CompiledFunction" in n.name()), None)
        if node is not None and "CompiledFunction" in node.name():
            nodes[id(node)] = node
    state = {}
    memory = session.memory

    def pre(grad_outputs):
        if not session.passthrough and session.is_open:
            if memory is not None:     # what it saved, before its backward frees it (memory/)
                node = torch._C._current_autograd_node()
                memory.table.node_runs(node, node._sequence_nr())
            state["open"] = (session.open_range(LABEL, attrs), _now())

    def post(grad_inputs, grad_outputs):
        opened = state.pop("open", None)
        if opened is not None:
            session.close_range(*opened)

    for node in nodes.values():
        node.register_prehook(pre)
        node.register_hook(post)
