"""Constructed runs with known times for the timeline, critical-path and phase tests: ranks
built with constructed.synthetic (real trace files through the tracer's own writer) on a clock of
1 us units from an arbitrary origin, analysed through the real reader, and the GPipe schedule
of the papers on two stages, by hand."""
from __future__ import annotations

from tracer.vocab.labels import PHASE_BACKWARD
from support.constructed.synthetic import SyntheticRank, write_run
from viz.analysis import analyse
from viz.run import open_run

U = 1_000            # one constructed-clock unit: 1 us, in ns
BASE = 1_000_000_000  # constructed clocks start here (any monotonic origin)


def synthetic(rank, world, config=None):
    """A constructed rank on this module's clock."""
    return SyntheticRank(rank, world, config, unit_ns=U, base_ns=BASE)


def analysed(tmp_path, ranks):
    write_run(tmp_path, ranks)
    return analyse(open_run(str(tmp_path)))


def gpipe_two_stages(config=None):
    """GPipe, p=2, m=2, T_F=10, T_B=20, P2P free: the schedule of the papers, by hand.

    rank 0: F0 [0,10) F1 [10,20) waits B0's grad until 50, B0 [50,70) B1 [70,90)
    rank 1: waits F0 until 10, F0 [10,20) F1 [20,30) B0 [30,50) B1 [50,70), done
    """
    config = config or {"pp": 2, "microbatches": 2, "schedule": "gpipe", "virtual_stages": 1}
    r0, r1 = synthetic(0, 2, config), synthetic(1, 2, config)
    for r in (r0, r1):
        r.op(-50, -40)
        r.next_step(0)
    r0.annotate("F", 0, 10, microbatch=0, chunk=0)
    r0.op(0, 10)
    r0.comm("send", 10, 10, 95, peer=1)          # waited at the end: capped to the recv's end
    r0.annotate("F", 10, 20, microbatch=1, chunk=0)
    r0.op(10, 20)
    r0.comm("send", 20, 20, 96, peer=1)
    r0.annotate("B", 20, 70, microbatch=0, chunk=0)
    r0.comm("recv", 20, 20, 50, peer=1)
    r0.op(50, 70, phase=PHASE_BACKWARD)
    r0.annotate("B", 70, 90, microbatch=1, chunk=0)
    r0.comm("recv", 70, 70, 70, peer=1)
    r0.op(70, 90, phase=PHASE_BACKWARD)
    r1.annotate("F", 0, 20, microbatch=0, chunk=0)
    r1.comm("recv", 0, 0, 10, peer=0)
    r1.op(10, 20)
    r1.annotate("F", 20, 30, microbatch=1, chunk=0)
    r1.comm("recv", 20, 20, 20, peer=0)
    r1.op(20, 30)
    r1.annotate("B", 30, 50, microbatch=0, chunk=0)
    r1.op(30, 50, phase=PHASE_BACKWARD)
    r1.comm("send", 50, 50, 97, peer=0)
    r1.annotate("B", 50, 70, microbatch=1, chunk=0)
    r1.op(50, 70, phase=PHASE_BACKWARD)
    r1.comm("send", 70, 70, 98, peer=0)
    for r in (r0, r1):
        r.next_step(100)
        r.op(100, 110)
    return r0, r1


SITE = [("/src/train.py", 10, "step", "step")]


def phase_run(directory, extra_recompute: int = 0):
    ranks = []
    for rank in range(2):
        r = SyntheticRank(rank, 2)
        r.next_step(0)
        t = 1
        for phase in ("forward", "forward", "backward", "recompute", "optimizer", "other"):
            r.op(t, t + 1, "aten.mm.default", phase=phase, stack=SITE, module="Net.a")
            t += 2
        for _ in range(extra_recompute):
            r.op(t, t + 1, "aten.mm.default", phase="recompute", stack=SITE, module="Net.a")
            t += 2
        r.op(t, t + 1, "aten.add_.Tensor", phase="optimizer", stack=SITE)
        r.comm("all_reduce", t + 2, t + 3, t + 5, phase="grad_sync", stack=SITE)
        r.comm("all_gather", t + 6, t + 7, t + 9, phase="forward", stack=SITE, module="Net.a")
        r.next_step(t + 10)
        ranks.append(r)
    return write_run(directory, ranks)
