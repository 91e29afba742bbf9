"""Op groups and profiles built by hand, for the trace-diff tests: known frames, counts and
times on each side."""
from __future__ import annotations

from viz.analysis.callgraphs.op_groups import Frame, OpGroup
from viz.diff.profile import Profile


def group(rank, frames, op="aten.mm.default", phase="forward", kind=None, count=1, flops=0,
          module="m", nbytes=0):
    return OpGroup(rank, tuple(frames), None, None, op, phase, kind, None, module, count,
                   1000.0 * count, nbytes, flops)


def frames(root, *names_lines):
    return [Frame(f"{root}/pkg/model.py", line, name.split(".")[-1], name)
            for name, line in names_lines]


def profile(rank, **counters):
    p = Profile((rank,))
    for name, values in counters.items():
        getattr(p, name).update(values)
    p.time = {"wall_s": 1.0 + rank, "bubble_fraction": None}
    return p
