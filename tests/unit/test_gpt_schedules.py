"""Pipeline schedule orders of the reference GPT against docs/oracles.md and basic invariants."""
from __future__ import annotations

import pytest

from tracer.vocab.schedules import schedule_actions


def order(name, *, p, r, m, v=1):
    return " ".join(str(a) for a in schedule_actions(name, stages=p, rank=r, microbatches=m,
                                                     chunks=v))


def test_1f1b_order_p4_m8():
    assert order("1f1b", p=4, r=0, m=8) == "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7"
    assert order("1f1b", p=4, r=3, m=8) == " ".join(f"F{i} B{i}" for i in range(8))


def test_gpipe_runs_all_forwards_first():
    assert order("gpipe", p=2, r=0, m=3) == "F0 F1 F2 B0 B1 B2"


@pytest.mark.parametrize("p,v,m", [(4, 2, 8), (2, 2, 4), (4, 4, 8), (2, 3, 6)])
def test_interleaved_warmup_is_megatrons(p, v, m):
    for r in range(p):
        actions = schedule_actions("interleaved", stages=p, rank=r, microbatches=m, chunks=v)
        forwards_before_first_b = next(i for i, a in enumerate(actions) if a.kind == "B")
        warmup = m * v if m == p else min(2 * (p - r - 1) + (v - 1) * p, m * v)
        # the steady phase starts with one more forward before its first backward
        assert forwards_before_first_b == min(warmup + 1, m * v)


def test_interleaved_p2_v2_m4_rank0():
    assert order("interleaved", p=2, r=0, m=4, v=2) == \
        "F0 F1 F0.1 F1.1 F2 B0.1 F3 B1.1 F2.1 B0 F3.1 B1 B2.1 B3.1 B2 B3"


def test_zb_h1_stage_r_defers_r_weight_passes():
    assert order("zb-h1", p=4, r=0, m=8).startswith("F0 F1 F2 F3 B0 W0 F4 B1 W1")
    assert order("zb-h1", p=4, r=3, m=8).startswith("F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1")


@pytest.mark.parametrize("name,v", [("gpipe", 1), ("1f1b", 1), ("zb-h1", 1), ("interleaved", 2)])
@pytest.mark.parametrize("p,m", [(1, 3), (2, 4), (4, 8)])
def test_every_pass_once_and_in_dependency_order(name, v, p, m):
    if name == "interleaved" and p == 1:
        pytest.skip("interleaving needs p >= 2")
    for r in range(p):
        actions = schedule_actions(name, stages=p, rank=r, microbatches=m, chunks=v)
        seen = [(a.kind, a.microbatch, a.chunk) for a in actions]
        kinds = "FBW" if name == "zb-h1" else "FB"
        assert sorted(seen) == sorted((k, i, c) for k in kinds for i in range(m) for c in range(v))
        for i in range(m):
            for c in range(v):
                assert seen.index(("F", i, c)) < seen.index(("B", i, c))
                if name == "zb-h1":
                    assert seen.index(("B", i, c)) < seen.index(("W", i, c))
        in_flight = peak = 0
        for kind, _, _ in seen:
            in_flight += {"F": 1, "B": 0 if name == "zb-h1" else -1, "W": -1}[kind]
            peak = max(peak, in_flight)
        if name in ("1f1b", "zb-h1"):
            assert peak <= p  # micro-batches not yet past B (ZB-H1: not yet past W)
