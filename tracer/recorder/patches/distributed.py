"""The patches into torch.distributed: the process group's arrival and end (the session), where a
rank waits for a collective (comm.py), DDP's setup (phases.py), torch.distributed.pipelining's
stages and schedules (pipelining.py) and DeviceMesh's groups, named by their dimensions
(group_names.py)."""
from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import sys
import time
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from tracer.recorder.frameworks import pipelining
from tracer.recorder.process import process_group
from tracer.recorder.comm import wait_hook
from tracer.vocab.labels import SCHEDULE_LABEL

if TYPE_CHECKING:
    from . import Patches

_SCHEDULES = "torch.distributed.pipelining.schedules"
_DEVICE_MESH = "torch.distributed.device_mesh"


def install(patches: "Patches", session) -> None:
    _ddp(patches, session.rules)
    _when_imported(patches, _SCHEDULES, lambda: _pipelining(patches, session))
    _when_imported(patches, _DEVICE_MESH, lambda: _device_mesh(patches, session.comm.names))
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


def _when_imported(patches: "Patches", module: str, then) -> None:
    """``then()`` now if ``module`` is imported, else as soon as it is (the recorder imports
    neither pipelining nor DeviceMesh: that costs seconds)."""
    if module in sys.modules:
        then()
        return
    finder = _OnImport(module, then)
    sys.meta_path.insert(0, finder)

    def forget() -> None:
        if finder in sys.meta_path:
            sys.meta_path.remove(finder)
    patches.on_undo(forget)


# ---------------------------------------------------------------------------- DeviceMesh
def _device_mesh(patches: "Patches", names) -> None:
    """Each group a DeviceMesh hands out (``get_group``: the user's, DTensor's and FSDP's way to
    a mesh dimension's group) and each dimension of a mesh made with its groups is named by the
    dimension: torch gives a dimension that spans the world the default group, whose
    ``group_desc`` is ``default_pg``, and the name would be lost."""
    mesh_type = getattr(sys.modules.get(_DEVICE_MESH), "DeviceMesh", None)
    if mesh_type is None:
        return

    def named(mesh, dim, group) -> None:
        dims = getattr(mesh, "mesh_dim_names", None)
        if not dims:
            return
        index = dims.index(dim) if isinstance(dim, str) and dim in dims else \
            dim if isinstance(dim, int) else 0 if dim is None and len(dims) == 1 else None
        if index is not None and 0 <= index < len(dims):
            names.mesh_group(group, dims[index])

    def make_get_group(original):
        @functools.wraps(original)
        def get_group(mesh, mesh_dim=None):
            group = original(mesh, mesh_dim)
            named(mesh, mesh_dim, group)
            return group
        return get_group

    def make_init(original):
        @functools.wraps(original)
        def init(mesh, *args, **kwargs):
            original(mesh, *args, **kwargs)
            try:
                for index in range(len(getattr(mesh, "mesh_dim_names", None) or ())):
                    mesh.get_group(index)
            except RuntimeError:       # a slice of a mesh: its groups come after (named then)
                pass
        return init
    patches.wrap(mesh_type, "get_group", make_get_group)
    patches.wrap(mesh_type, "__init__", make_init)


# ---------------------------------------------------------------------------- pipelining


def _pipelining(patches: "Patches", session) -> None:
    """The stages' passes and P2P messages, the schedules' loss, steps, setup, gradient
    reduction and P2P batches: what pipelining.py's doc lists."""
    stage_mod = sys.modules.get("torch.distributed.pipelining.stage")
    sched_mod = sys.modules.get(_SCHEDULES)
    base = getattr(stage_mod, "_PipelineStageBase", None)
    if base is None or sched_mod is None:   # another torch: its labels still name passes
        return
    annotations = session.annotations

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
