"""The parameters and buffers of each root module, written once into the trace's metadata
(``parameters``; docs/trace-format.md): what trace-whatif needs to predict another sharding,
tensor-parallel plan or pipeline split of the same model (viz/whatif/recorded/layout.py) without
guessing parameters from op shapes.

When a module runs with no module around it (a root: the model, DDP or FSDP2's wrapper, a
pipeline stage; modules.py), its ``named_parameters()`` and ``named_buffers()`` are listed
under its recorded path (its class's name): each parameter as ``[name, shape, dtype,
requires_grad, placements, local shape, mesh]``, where a DTensor (FSDP2's shards, tensor
parallelism) gives its global shape, its placements (``["S(0)"]``, ``["R"]``, ``["P"]``),
its local shard's shape and its mesh's ``[dim names, sizes]``, a plain tensor null for those
three; each buffer as ``[name, shape, dtype]``. Roots of the same class (two pipeline stages
of one model on a rank) share one entry, by name. Once per root, at its first call: nothing
runs per op.
"""
from __future__ import annotations

import weakref
from typing import Callable, Optional

from ..compat import local_shape

META_KEY = "parameters"


def _dtype(tensor) -> str:
    return str(tensor.dtype).replace("torch.", "")


def _placement(p) -> str:
    """``S(d)``, ``R``, ``P`` (and anything else as torch prints it)."""
    if p.is_shard():
        return f"S({p.dim})"
    if p.is_replicate():
        return "R"
    if p.is_partial():
        return "P"
    return str(p)


def parameter_entry(name: str, param) -> list:
    """One parameter as the metadata lists it (module doc). Nothing here dispatches an op:
    it runs in a recorded forward (no ``to_local()``, no ``DeviceMesh.mesh``)."""
    placements = getattr(param, "placements", None)
    local = local_shape(param)
    if placements is None or local is None:
        return [name, list(param.shape), _dtype(param), bool(param.requires_grad),
                None, None, None]
    mesh = param.device_mesh
    return [name, list(param.shape), _dtype(param), bool(param.requires_grad),
            [_placement(p) for p in placements], list(local),
            [list(mesh.mesh_dim_names or ()), list(mesh.shape)]]


def describe(module) -> Optional[dict]:
    """``{"parameters": [entry, ...], "buffers": [entry, ...]}`` of a root (module doc), or
    None when it holds neither."""
    params = [parameter_entry(name, p) for name, p in module.named_parameters()]
    buffers = [[name, list(b.shape), _dtype(b)] for name, b in module.named_buffers()]
    if not params and not buffers:
        return None
    return {"parameters": params, "buffers": buffers}


class ParameterLayout:
    """Writes each new root's parameters into the metadata, through ``merge(key, values)``
    (the flusher's ``merge_meta``)."""

    def __init__(self, merge: Callable[[str, dict], None]):
        self._merge = merge
        self._seen: "weakref.WeakSet" = weakref.WeakSet()
        self._written: dict = {}          # path -> what was written under it

    def __call__(self, module, path: str) -> None:
        if module in self._seen:
            return
        self._seen.add(module)
        try:
            found = describe(module)
        except (RuntimeError, AttributeError, TypeError):
            return                        # a module whose parameters cannot be listed now
        if found is None:
            return
        mine = self._written.setdefault(path, {"parameters": {}, "buffers": {}})
        for key in ("parameters", "buffers"):
            mine[key].update((entry[0], entry) for entry in found[key])
        self._merge(META_KEY, {path: {"parameters": list(mine["parameters"].values()),
                                      "buffers": list(mine["buffers"].values())}})
