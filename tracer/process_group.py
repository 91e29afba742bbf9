"""The recorder's patches of torch.distributed, kept apart so the recorder never grows
monkey-patching: ``init_process_group`` (rank, world size and clock alignment become known),
``destroy_process_group`` (the last chance to align clocks) and ``Work.wait`` (where a rank
waits for its collectives: their completion, and the ops a backend runs inside the wait)."""
from __future__ import annotations

import time
from typing import Callable

import torch
import torch.distributed as dist


def patch_process_group(*, on_init: Callable[[int], None], on_destroy: Callable[[], None],
                        wait_work: Callable[[Callable, object, tuple, dict], object]
                        ) -> Callable[[], None]:
    """Install the patches; returns the function that removes them.

    ``on_init(t0)`` runs after a process group was created (``t0``: perf_counter_ns when the
    call began), ``on_destroy`` before the default group is destroyed; every
    ``work.wait(*args, **kwargs)`` becomes ``wait_work(original_wait, work, args, kwargs)``.
    """
    if not dist.is_available():
        return lambda: None
    import torch.distributed.distributed_c10d as c10d
    patched = []
    original_init, original_destroy = c10d.init_process_group, c10d.destroy_process_group

    def init_process_group(*args, **kwargs):
        t0 = time.perf_counter_ns()
        result = original_init(*args, **kwargs)
        on_init(t0)
        return result

    def destroy_process_group(group=None):
        if group is None or group is c10d.GroupMember.WORLD:
            on_destroy()
        return original_destroy(group)

    work_type = torch._C._distributed_c10d.Work
    original_wait = work_type.wait

    def wait(work, *args, **kwargs):
        return wait_work(original_wait, work, args, kwargs)

    work_type.wait = wait
    patched.append((work_type, "wait", original_wait))
    # NOTE: torch.distributed re-exports both functions: patch each binding that is the original
    for module in (c10d, dist):
        for name, new, old in (("init_process_group", init_process_group, original_init),
                               ("destroy_process_group", destroy_process_group,
                                original_destroy)):
            if getattr(module, name, None) is old:
                setattr(module, name, new)
                patched.append((module, name, old))

    def unpatch() -> None:
        for owner, name, old in patched:
            setattr(owner, name, old)
        patched.clear()

    return unpatch
