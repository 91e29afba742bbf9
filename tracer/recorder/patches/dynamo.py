"""The patches into torch.compile's machinery: Dynamo's compiled module call, its compilation of
a frame and its call of a backend (compiled.py), and the ``tag_activation_checkpoint``
higher-order operator (hops.py)."""
from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from tracer.recorder.frameworks import compiled as _compiled, hops

if TYPE_CHECKING:
    from . import Patches


def install(patches: "Patches", session, compiled: bool) -> None:
    _optimized_module_call(patches)
    if compiled:
        _compile_unrecorded(patches)
        _backend_call(patches, session)
    _tag_activation_checkpoint(patches, session)


def _optimized_module_call(patches: "Patches") -> None:
    """``OptimizedModule.__call__`` without its warning about global module hooks (harmless
    here: compiled.py)."""
    try:
        from torch._dynamo import eval_frame
    except ImportError:    # pragma: no cover - torch without Dynamo
        return
    in_optimized = getattr(eval_frame, "_set_in_optimized_module", None)
    if in_optimized is None:    # another torch: keep its warning
        return

    def make(original):
        def call(self, *args, **kwargs):
            with in_optimized():
                return torch.nn.Module.__call__(self, *args, **kwargs)
        return call
    patches.wrap(getattr(eval_frame, "OptimizedModule", None), "__call__", make)


def _compile_unrecorded(patches: "Patches") -> None:
    """Dynamo's compilation of a frame (``convert_frame._compile``: tracing with fake tensors,
    the backend's compilation, inductor's benchmarking) with the dispatch modes off the stack
    (compiled.py)."""
    try:
        from torch._dynamo import convert_frame
    except ImportError:    # pragma: no cover - torch without Dynamo
        return
    patches.wrap(convert_frame, "_compile", _compiled.without_modes)


def _backend_call(patches: "Patches", session) -> None:
    """Every graph a backend compiles records each of its calls (compiled.Region)."""
    try:
        from torch._dynamo.output_graph import OutputGraph
    except ImportError:    # pragma: no cover
        return
    modules = session.modules

    def make(original):
        def call_user_compiler(graph, gm, example_inputs):
            return _compiled.region_of(session, modules, original(graph, gm, example_inputs),
                                       graph)
        return call_user_compiler
    patches.wrap(OutputGraph, "call_user_compiler", make)


def _tag_activation_checkpoint(patches: "Patches", session) -> None:
    """``tag_activation_checkpoint``'s call as a range (it bypasses the dispatcher in eager
    code: hops.py)."""
    try:
        from torch._higher_order_ops.wrap import TagActivationCheckpoint
    except ImportError:     # pragma: no cover - another torch
        return

    def make(original):
        def call(self, gmod, *args, **kwargs):
            return hops.call_tag_activation_checkpoint(session, original, self, gmod, args,
                                                       kwargs)
        return call
    patches.wrap(TagActivationCheckpoint, "__call__", make)
