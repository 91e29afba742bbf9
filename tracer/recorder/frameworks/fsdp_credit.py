"""FSDP2's communication credited to the module whose parameters it moves (docs/phases.md,
"FSDP2").

fully_shard all-gathers a module's parameters before its forward and again before its
backward, and reduce-scatters their gradients after its backward. Credited to the module running
when FSDP issues it, a backward all-gather lands one module downstream: FSDP issues it from a
hook on the module's forward outputs, which runs inside the autograd node of the module that
consumed them, and it prefetches: the pre-backward hook of one module all-gathers the
parameters of the module whose backward comes next. The reduce-scatters of the last modules run
from the backward's final callback, where no module runs at all.

While a trace records, tracer/recorder/patches/fsdp.py wraps FSDP's parameter groups
(FSDPParamGroup, one per fully_shard call) with these:

- ``unshard`` (its all-gather) and ``post_backward`` (its reduce-scatter, and HSDP's
  all-reduce): every collective launched inside is credited to the group's module (the first
  of them, for ``fully_shard([a, b])``): the trace's ``module`` column of those rows; in
  backward their ``fwd_stack`` is the stack of the group's last unshard outside backward (its
  forward all-gather: where the module was called), not that of the autograd node whose hook
  issued it (null where there was none);
- ``_prefetch_unshard``: a recorded range ``fsdp.prefetch`` around it, whose attributes say
  whose parameters it gathers (``module``), which module's hook prefetched them (``by``; null
  where unknown) and in which pass (``pass``: ``forward``, ``backward``); the all-gather inside
  carries it in its annotation;
- ``pre_backward`` (FSDPParamGroup and FSDPState): the module that prefetches in backward; in
  forward it is the module whose forward pre-hook runs (modules.py's innermost).

Nothing here runs per op: each wrapper runs once per parameter group and pass.
"""
from __future__ import annotations

import functools
import sys
import weakref
from threading import get_ident as _get_ident
from time import perf_counter_ns as _now
from typing import Optional

import torch

PREFETCH_LABEL = "fsdp.prefetch"
_current_node = torch._C._current_autograd_node
_graph_task = getattr(torch._C, "_current_graph_task_id", lambda: -1)


class FsdpCredit:
    """The module a recording credits FSDP's collectives to, and who prefetched them."""

    def __init__(self, session):
        self._session = session
        self._tracker = session.modules
        self._owners = session.comm.owners      # thread -> module id (comm.py)
        self._paths = weakref.WeakKeyDictionary()   # module -> (path, module id)
        self._issuers: dict = {}                 # thread -> [paths of pre-backward hooks]
        self._sites = weakref.WeakKeyDictionary()   # group -> stack id of its forward unshard

    def module_of(self, modules) -> Optional[tuple]:
        """(path, module id) of a parameter group's module(s): the first one's path."""
        module = modules[0] if isinstance(modules, (tuple, list)) and modules else modules
        if module is None:
            return None
        try:
            found = self._paths.get(module)
        except TypeError:                        # not weak-referenceable: not a module
            return None
        if found is None:
            path = self._tracker.path_of(module)
            found = (path, self._tracker.intern(path))
            # NOTE: a module met before its root ran is named by its class: asked again later
            if "." in path or module in self._tracker.roots:
                self._paths[module] = found
        return found

    def crediting(self, original):
        """A parameter group's method whose collectives are the group module's."""
        @functools.wraps(original)
        def method(group, *args, **kwargs):
            found = self.module_of(getattr(group, "modules", None))
            if found is None:
                return original(group, *args, **kwargs)
            session = self._session
            fwd = -1
            if _current_node() is not None or _graph_task() >= 0:     # in backward
                fwd = self._sites.get(group, -1)
            elif session.options.record_stacks and not session.passthrough:
                # the caller: FSDP's pre-forward hook (the stack its all-gather gets)
                fwd = session.stacks.capture(sys._getframe(1))
                self._sites[group] = fwd
                fwd = -1
            owners, thread = self._owners, _get_ident()
            before = owners.get(thread)
            owners[thread] = (found[1], fwd)
            try:
                return original(group, *args, **kwargs)
            finally:
                if before is None:
                    owners.pop(thread, None)
                else:
                    owners[thread] = before
        return method

    def issuing(self, modules_attr: str, original):
        """A pre-backward hook (of an FSDPParamGroup: ``modules``; of an FSDPState:
        ``_modules``): the prefetches it makes are its module's."""
        @functools.wraps(original)
        def method(owner, *args, **kwargs):
            found = self.module_of(getattr(owner, modules_attr, None))
            stack = self._issuers.setdefault(_get_ident(), [])
            stack.append(found[0] if found is not None else None)
            try:
                return original(owner, *args, **kwargs)
            finally:
                stack.pop()
        return method

    def prefetching(self, original):
        """``FSDPParamGroup._prefetch_unshard(target, pass_type)`` (a staticmethod) in a
        ``fsdp.prefetch`` range."""
        fn = original.__func__ if isinstance(original, staticmethod) else original

        @functools.wraps(fn)
        def prefetch(target, pass_type, *args, **kwargs):
            found = self.module_of(getattr(target, "modules", None))
            stack = self._issuers.get(_get_ident())
            if stack:
                by = stack[-1]
            else:     # forward: the module whose forward pre-hook prefetches
                by = self._tracker.path if pass_type == "forward" else None
            attrs = {"source": "fsdp", "module": found[0] if found else None, "by": by,
                     "pass": str(pass_type)}
            t0 = _now()
            entry = self._session.open_range(PREFETCH_LABEL, attrs)
            try:
                return fn(target, pass_type, *args, **kwargs)
            finally:
                self._session.close_range(entry, t0)
        return staticmethod(prefetch) if isinstance(original, staticmethod) else prefetch
