"""nn.Module path tracking through torch's global module hooks.

The path of a module is its root's class name followed by the attribute names leading to it:
``GPT.blocks.0.attn.qkv``. A module called from a module that does not own it (a tied embedding
reused as the LM head) is named by its path from the root when the root owns it, else by its class.
Backward ops get the module of the forward op that created their autograd node (see op_path.py).
"""
from __future__ import annotations

import functools
import weakref

import torch
from torch.nn.modules import module as _module

from .parameters import ParameterLayout

_is_compiling = torch.compiler.is_compiling
_GraphModule = torch.fx.GraphModule


def _unwrapped(module):
    """The module a torch.compile OptimizedModule wraps (also once FSDP2's ``fully_shard``
    made it an ``FSDPOptimizedModule``), else the module."""
    return module.__dict__["_modules"]["_orig_mod"] if _is_optimized(type(module)) else module


@functools.lru_cache(maxsize=None)
def _is_optimized(cls) -> bool:
    # NOTE: by name: importing torch._dynamo here would cost seconds at import
    return any(base.__name__ == "OptimizedModule" for base in cls.__mro__)


def _without_wrappers(name: str) -> str:
    """A ``named_modules`` name without torch.compile's wrapper attribute: the wrapper and the
    module it wraps are one module (``_orig_mod.blocks.0._orig_mod.mlp``: ``blocks.0.mlp``)."""
    return ".".join(part for part in name.split(".") if part != "_orig_mod") \
        if "_orig_mod" in name else name


class ModuleTracker:
    """Keeps the stack of modules whose forward is running and the interned id of the innermost;
    with ``merge_meta`` (the flusher's), writes each root's parameters into the metadata at its
    first call (parameters.py)."""

    def __init__(self, intern, merge_meta=None):
        self._intern = intern              # str -> id
        self._layout = ParameterLayout(merge_meta) if merge_meta is not None else None
        self.current = -1                  # interned id of the innermost module path, -1: none
        self._stack: list = []             # [(module, path id, path)]
        self._names: dict = {}             # id(child) -> (child ref, parent ref, path)
        self._root_paths = weakref.WeakKeyDictionary()
        self.roots = weakref.WeakSet()     # modules called with no module around (phases.py)
        self._handles = []

    @property
    def path(self):
        """The innermost running module's path, or None."""
        return self._stack[-1][2] if self._stack else None

    def intern(self, path: str) -> int:
        return self._intern(path)

    def path_of(self, module) -> str:
        """The path a module is recorded under, outside its forward: its class's name if it
        runs as a root (or nothing recorded owns it), else its path from the root that owns
        it. Walks the roots' modules: for rare lookups (phases.py caches them)."""
        for root in list(self.roots):
            if root is module:
                break
            for name, child in root.named_modules():
                if child is module and name:
                    name = _without_wrappers(name)
                    return f"{type(_unwrapped(root)).__name__}.{name}" if name else \
                        type(_unwrapped(root)).__name__
        return type(_unwrapped(module)).__name__

    def path_of_parameter(self, param):
        """The path of the module that owns ``param`` directly, or None."""
        for root in list(self.roots):
            for name, child in root.named_modules():
                if any(p is param for p in child.parameters(recurse=False)):
                    root_name, name = type(_unwrapped(root)).__name__, _without_wrappers(name)
                    return f"{root_name}.{name}" if name else root_name
        return None

    def install(self) -> None:
        self._handles = [
            _module.register_module_forward_pre_hook(self.pre_forward),
            _module.register_module_forward_hook(self.post_forward, always_call=True),
        ]

    @property
    def installed(self) -> bool:
        return bool(self._handles)

    @property
    def idle(self) -> bool:
        """No module's forward is running."""
        return not self._stack

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._stack.clear()
        self.current = -1

    def _name(self, module) -> str:
        if not self._stack:
            path = type(_unwrapped(module)).__name__
            if module not in self.roots:
                self.roots.add(module)
                if self._layout is not None:
                    self._layout(module, path)
            return path
        parent, _, parent_path = self._stack[-1]
        cached = self._names.get(id(module))
        if cached is not None and cached[0]() is module and cached[1]() is parent:
            return cached[2]
        path = None
        for attr, child in parent._modules.items():
            if child is module:
                # torch.compile's OptimizedModule is named as the module it wraps
                path = parent_path if attr == "_orig_mod" and _unwrapped(parent) is module \
                    else f"{parent_path}.{attr}"
                break
        if path is None:
            root, _, root_path = self._stack[0]
            paths = self._root_paths.get(root)
            if paths is None:
                paths = {id(m): _without_wrappers(n)
                         for n, m in root.named_modules(remove_duplicate=False)}
                self._root_paths[root] = paths
            name = paths.get(id(module))     # "": the root, or the module a root wraps
            # a GraphModule nobody owns is a compiled graph (compiled.py) run by its backend
            path = (f"{root_path}.{name}" if name else root_path) if name is not None else \
                parent_path if isinstance(module, _GraphModule) else type(module).__name__
        key = id(module)
        try:
            # NOTE: by id, not a WeakKeyDictionary (which makes a weakref at every lookup); the
            # entry goes when the module does, before its id can be reused
            self._names[key] = (weakref.ref(module, lambda _, k=key: self._names.pop(k, None)),
                                weakref.ref(parent), path)
        except TypeError:
            pass
        return path

    def snapshot(self) -> list:
        """The stack of running modules (a copy), for :meth:`restore`."""
        return list(self._stack)

    def restore(self, stack) -> list:
        """Make ``stack`` (from :meth:`snapshot`; None: leave it) the running modules; returns
        the stack it replaced. Checkpointing's recomputation runs a forward again inside the
        backward: under the modules that enclosed it in the forward."""
        old = self._stack
        if stack is not None:
            self._stack = list(stack)
            self.current = self._stack[-1][1] if self._stack else -1
        return old

    # NOTE: while Dynamo traces a module call it inlines these hooks: they must do nothing
    # there (compiled.py); in eager code is_compiling() is one call
    def pre_forward(self, module, args):
        """The forward pre-hook: module is now the innermost running."""
        if _is_compiling():
            return
        path = self._name(module)
        pid = self._intern(path)
        self._stack.append((module, pid, path))
        self.current = pid

    def post_forward(self, module, args, output):
        """The forward hook (always called): module, and any left above it, ended."""
        if _is_compiling():
            return
        stack = self._stack
        # Pop up to and including this module (a forward that raised may have left entries).
        for i in range(len(stack) - 1, -1, -1):
            if stack[i][0] is module:
                del stack[i:]
                break
        self.current = stack[-1][1] if stack else -1
