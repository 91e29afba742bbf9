"""Runs a module as ``__main__`` (``python counted_collectives.py OUT MODULE ARGS...``) with each
top-level call of a torch.distributed collective counted by the process itself, apart from the
recorder: per training step (advanced after each optimizer step, as the recorder's steps are)
and per group, named by the ``group_desc`` the group was made with (None: unnamed). Each rank
writes ``OUT.rank-<R>.json``: ``{"<step>": {"<desc or null>": calls}}``
(tests/integration/test_dimensions_runs.py)."""
import functools
import json
import os
import runpy
import sys
import threading

import torch.distributed as dist
from torch.optim.optimizer import register_optimizer_step_post_hook

COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter",
               "reduce_scatter_tensor", "broadcast", "reduce", "gather", "scatter",
               "all_to_all", "all_to_all_single", "barrier", "send", "recv", "isend", "irecv",
               "batch_isend_irecv")
calls: dict = {}
state = threading.local()
step = [0]


def desc_of(group) -> str:
    if group is None or group is dist.GroupMember.WORLD:
        return "null"
    return json.dumps(getattr(group, "group_desc", None) or None)


def counted(name: str, fn):
    @functools.wraps(fn)
    def call(*args, **kwargs):
        if getattr(state, "inside", False):       # a collective made by another one
            return fn(*args, **kwargs)
        if name == "batch_isend_irecv":
            group = args[0][0].group if args and args[0] else None
        else:
            group = kwargs.get("group")
        per_step = calls.setdefault(str(step[0]), {})
        key = desc_of(group)
        per_step[key] = per_step.get(key, 0) + 1
        state.inside = True
        try:
            return fn(*args, **kwargs)
        finally:
            state.inside = False
    return call


for name in COLLECTIVES:
    if hasattr(dist, name):
        setattr(dist, name, counted(name, getattr(dist, name)))
register_optimizer_step_post_hook(
    lambda optimizer, args, kwargs: step.__setitem__(0, step[0] + 1))

out, module = sys.argv[1], sys.argv[2]
sys.argv = [module] + sys.argv[3:]
try:
    runpy.run_module(module, run_name="__main__", alter_sys=True)
finally:
    with open(f"{out}.rank-{os.environ['RANK']}.json", "w") as fh:
        json.dump(calls, fh)
