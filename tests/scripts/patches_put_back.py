"""Three traces in one process, for tests/unit/test_patches.py: what each replaced while it
recorded, and whether torch and os were as before once it ended.

Usage: patches_put_back.py OUT_DIR TARGETS_JSON. TARGETS_JSON: [[owner, name], ...], the owner
a dotted path (a module, or a class in one). The targets under torch.distributed.pipelining
are looked up only once it is imported: trace 0 runs without it, trace 1 imports it while
recording (the patches go in on import), trace 2 starts with it imported. Each trace runs a
checkpointed step with an optimizer; trace 2 also a one-rank gloo group, a waited all-reduce.
Prints one JSON object: per trace, the targets replaced during it (as the recorder reports
them, and as seen by comparing each target with what it was before), the targets not put back
after it, and whether the import hooks and optimizer hooks were put back.
"""
import importlib
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.optim.optimizer as optimizer_module
import torch.utils.checkpoint as checkpoint

import tracer

PIPELINING = "torch.distributed.pipelining"
work_dir, targets = sys.argv[1], [tuple(t) for t in json.loads(sys.argv[2])]


def resolve(path: str):
    """The module or class at a dotted path (importing the module part)."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            owner = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            owner = getattr(owner, name)
        return owner
    raise ImportError(path)


def state(owner_path: str, name: str) -> tuple:
    """(the object at owner.name, whether owner holds it itself rather than inherits it)."""
    owner = resolve(owner_path)
    return getattr(owner, name), name in vars(owner)


def defined_in_torch(value) -> bool:
    """A function torch's own source defines (no wrapper of paratrace's)."""
    code = getattr(value, "__code__", None)
    return code is not None and not hasattr(value, "__wrapped__") and \
        f"{os.sep}torch{os.sep}" in code.co_filename and "tracer" not in code.co_filename


def named(owner, name: str, known: list) -> list:
    """[owner path, name] of a target the recorder reports, as TARGETS_JSON names it."""
    for path, known_name in known:
        if known_name == name and resolve(path) is owner:
            return [path, name]
    return [f"unlisted: {owner!r}", name]


def visible(with_pipelining: bool) -> list:
    return [t for t in targets if with_pipelining or not t[0].startswith(PIPELINING)]


def hooks() -> tuple:
    return (len(optimizer_module._global_optimizer_pre_hooks),
            len(optimizer_module._global_optimizer_post_hooks))


def step() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 8, requires_grad=True)
    checkpoint.checkpoint(model, x, use_reentrant=False).sum().backward()
    opt.step()


def one_trace(index: int, import_pipelining: bool, process_group: bool) -> dict:
    had_pipelining = PIPELINING + ".schedules" in sys.modules
    before = {t: state(*t) for t in visible(had_pipelining)}
    meta_path, hooks_before = list(sys.meta_path), hooks()
    with tracer.trace(os.path.join(work_dir, f"trace-{index}")) as session:
        if import_pipelining:
            importlib.import_module(PIPELINING)
        step()
        if process_group:
            dist.init_process_group("gloo", init_method="file://" + os.path.join(
                work_dir, "store"), rank=0, world_size=1)
            dist.all_reduce(torch.ones(4), async_op=True).wait()
            dist.destroy_process_group()
        now = visible(PIPELINING + ".schedules" in sys.modules)
        reported = [named(owner, name, now) for owner, name in session._patches.replaced()]
        changed = [list(t) for t in now if t in before and state(*t)[0] is not before[t][0]]
        new = [list(t) for t in now if t not in before]
        hooks_during = hooks()
    not_back = [list(t) for t, was in before.items() if state(*t)[0] is not was[0]
                or state(*t)[1] != was[1]]
    not_back += [t for t in new if not defined_in_torch(state(*t)[0])]
    return {"reported": reported, "changed": changed, "imported_during": new,
            "not_put_back": not_back, "meta_path_back": sys.meta_path == meta_path,
            "hooks_before": hooks_before, "hooks_during": hooks_during,
            "hooks_after": hooks()}


assert PIPELINING + ".schedules" not in sys.modules, "something imported pipelining already"
result = [one_trace(0, False, False), one_trace(1, True, False), one_trace(2, False, True)]
print(json.dumps(result))
