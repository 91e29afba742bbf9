"""The patches into torch.distributed: the process group's arrival and end (the session), where a
rank waits for a collective (comm.py), DDP's setup (phases.py) and torch.distributed.pipelining's
stages and schedules (pipelining.py)."""
from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import sys
import time
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from tracer.recorder import pipelining, process_group
from tracer.recorder.comm import wait_hook
from tracer.vocab.labels import SCHEDULE_LABEL

if TYPE_CHECKING:
    from . import Patches

_SCHEDULES = "torch.distributed.pipelining.schedules"


def install(patches: "Patches", session) -> None:
    _ddp(patches, session._rules)
    _pipelining_when_imported(patches, session)
    if dist.is_available():
        _work_wait(patches, wait_hook(session))
        _process_group(patches, functools.partial(process_group.arrived, session),
                       functools.partial(process_group.departing, session))


def _ddp(patches: "Patches", rules) -> None:
    """DDP's constructor and the rebuild of its gradient buckets are setup (phases.py); the
    rules remember the wrappers made while recording."""
    try:
        from torch.nn.parallel import DistributedDataParallel as DDP
    except ImportError:   # pragma: no cover - torch without distributed
        return
    patches.wrap(getattr(torch._C._distributed_c10d, "Reducer", None), "_rebuild_buckets",
                 rules.as_setup)

    def make(original):
        setup = rules.as_setup(original)

        @functools.wraps(original)
        def init(ddp, *args, **kwargs):
            setup(ddp, *args, **kwargs)
            rules.ddp_made(ddp)
        return init
    patches.wrap(DDP, "__init__", make)


def _work_wait(patches: "Patches", waited) -> None:
    """Every ``work.wait(*args, **kwargs)`` becomes ``waited(original_wait, work, args,
    kwargs)`` (comm.wait_hook)."""
    def make(original):
        def wait(work, *args, **kwargs):
            return waited(original, work, args, kwargs)
        return wait
    patches.wrap(torch._C._distributed_c10d.Work, "wait", make)


def _process_group(patches: "Patches", on_init, on_destroy) -> None:
    """``on_init(t0)`` after a process group was created (``t0``: perf_counter_ns when the call
    began: rank, world size and clock alignment become known), ``on_destroy()`` before the
    default group is destroyed (the last chance to align clocks)."""
    import torch.distributed.distributed_c10d as c10d

    def make_init(original):
        def init_process_group(*args, **kwargs):
            t0 = time.perf_counter_ns()
            result = original(*args, **kwargs)
            on_init(t0)
            return result
        return init_process_group

    def make_destroy(original):
        def destroy_process_group(group=None):
            if group is None or group is c10d.GroupMember.WORLD:
                on_destroy()
            return original(group)
        return destroy_process_group

    # NOTE: torch.distributed re-exports both functions: the same wrapper goes in each binding
    # that is the original (a binding someone else replaced is left alone)
    for name, make in (("init_process_group", make_init),
                       ("destroy_process_group", make_destroy)):
        original = getattr(c10d, name, None)
        replacement = patches.wrap(c10d, name, make)
        if replacement is not None and getattr(dist, name, None) is original:
            patches.wrap(dist, name, lambda _, r=replacement: r)


# ---------------------------------------------------------------------------- pipelining
def _pipelining_when_imported(patches: "Patches", session) -> None:
    """torch.distributed.pipelining now if it is imported, else as soon as it is (the
    recorder does not import it: that costs seconds)."""
    if _SCHEDULES in sys.modules:
        _pipelining(patches, session)
        return
    finder = _OnImport(_SCHEDULES, lambda: _pipelining(patches, session))
    sys.meta_path.insert(0, finder)

    def forget() -> None:
        if finder in sys.meta_path:
            sys.meta_path.remove(finder)
    patches.on_undo(forget)


def _pipelining(patches: "Patches", session) -> None:
    """The stages' passes and P2P messages, the schedules' loss, steps, setup, gradient
    reduction and P2P batches: what pipelining.py's doc lists."""
    stage_mod = sys.modules.get("torch.distributed.pipelining.stage")
    sched_mod = sys.modules.get(_SCHEDULES)
    base = getattr(stage_mod, "_PipelineStageBase", None)
    if base is None or sched_mod is None:   # another torch: its labels still name passes
        return
    annotations = session._annotations

    def ranged(label: str, attrs_of):
        return functools.partial(pipelining.ranged, session, label, attrs_of)
    patches.wrap(base, "forward_one_chunk", ranged("F", pipelining.forward_attrs))
    patches.wrap(base, "backward_one_chunk", ranged("B", pipelining.backward_attrs))
    patches.wrap(base, "backward_weight_one_chunk", ranged("W", pipelining.weight_attrs))
    grad_sync = ranged(pipelining.REDUCE_GRAD_LABEL, pipelining.reduce_grad_attrs)
    patches.wrap(base, "perform_reduce_grad", grad_sync)
    patches.wrap(base, "scale_grads", grad_sync)
    for name, phase in pipelining.MESSAGE_PHASES:
        patches.wrap(base, name, functools.partial(pipelining.marking, phase))
    schedule = getattr(sched_mod, "_PipelineSchedule", None)
    if schedule is not None:
        patches.wrap(schedule, "_maybe_compute_loss", ranged("F", pipelining.loss_attrs))
        patches.wrap(schedule, "_initialize_pp_stages",
                     functools.partial(pipelining.setup, annotations))
    for name in ("PipelineScheduleSingle", "PipelineScheduleMulti"):
        patches.wrap(getattr(sched_mod, name, None), "step",
                     ranged(SCHEDULE_LABEL, pipelining.step_attrs))
    patches.wrap(sched_mod, "_batch_p2p", functools.partial(pipelining.phased_batch, annotations))


class _OnImport(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Runs ``then`` once module ``name`` has been executed (imported while recording)."""

    def __init__(self, name: str, then):
        self._name, self._then, self._loader = name, then, None

    def find_spec(self, name, path, target=None):
        if name != self._name or self._loader is not None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        self._loader, spec.loader = spec.loader, self
        return spec

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module) -> None:
        self._loader.exec_module(module)
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        self._then()
