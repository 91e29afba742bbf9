"""Time per phase (viz.analysis.timeline.phase_time, docs/metrics.md) on constructed traces with
known times: a data-parallel step with no annotation (forward, backward with a nested op, an
all-reduce waited before the optimizer), a step with recompute, an idle gap; per rank and per
step in summary.json's ``time`` and on the front page beside the step. Every expected number is
counted by hand from the rule (docs/metrics.md, "Time per phase")."""
from __future__ import annotations

import pytest

from support.constructed_timelines import analysed, synthetic
from viz.render.summary_schema import time_json
from viz.views.pages import headline_rows, phase_columns

US = 1e-6


def ddp_rank(rank: int, recompute: bool):
    """Step 0: setup. Step 1 (the window [0, 80)):

    forward    [0, 10) and [12, 20): the gap 10-12 leads to the next forward op   -> 20
    backward   the gap 20-25, then [25, 40) holding a nested op [30, 35)            -> 20
               (rank 1: recompute [25, 32) first, the gap 20-25 leading to it: 12,
               then backward [32, 40): 8)
    grad_sync  the gap 40-45, the all-reduce launched at 45, returned at 46, then
               the wait until its completion at 60 inside the gap before 70         -> 20
    optimizer  the rest of that gap 60-70 and its op [70, 80)                      -> 20
    Step 2 (the window [80, 60100)): forward [80, 90), an idle gap of 60 ms (more
    than IDLE_GAP_NS: no phase's), forward [60090, 60100)                            -> 20
    """
    r = synthetic(rank, 2)
    r.op(-50, -40, phase="other")
    r.next_step(0)
    r.op(0, 10, phase="forward")
    r.op(12, 20, phase="forward")
    if recompute:
        r.op(25, 32, phase="recompute")
        r.op(32, 40, phase="backward")
    else:
        r.op(25, 40, phase="backward")
        r.op(30, 35, phase="backward")
    r.comm("all_reduce", 45, 46, 60, phase="grad_sync", group=(0, 1))
    r.op(70, 80, phase="optimizer")
    r.next_step(80)
    r.op(80, 90, phase="forward")
    r.op(60090, 60100, phase="forward")
    r.next_step(60100)
    return r


@pytest.fixture(scope="module")
def analysis(tmp_path_factory):
    return analysed(tmp_path_factory.mktemp("phases"),
                    [ddp_rank(0, recompute=False), ddp_rank(1, recompute=True)])


def test_each_step_splits_into_its_phases(analysis):
    step1 = {"other": 0, "forward": 20, "backward": 20, "recompute": 0, "grad_sync": 20,
             "optimizer": 20}
    for rank, expected in ((0, step1), (1, dict(step1, backward=8, recompute=12))):
        steps = {s.step: s for s in analysis.metrics[rank].steps}
        assert steps[1].phase_s == pytest.approx({p: v * US for p, v in expected.items()})
        assert sum(steps[1].phase_s.values()) == pytest.approx(steps[1].wall_s)  # no idle
        # step 2: the 60 ms gap is idle, no phase's
        assert steps[2].phase_s == pytest.approx(
            {p: (20 * US if p == "forward" else 0.0) for p in step1})
        assert steps[2].wall_s == pytest.approx(60020 * US)
        # step 0 (setup): the op's 10, then the gap up to step 1's first op, forward
        assert steps[0].phase_s["other"] == pytest.approx(10 * US)
        assert steps[0].phase_s["forward"] == pytest.approx(40 * US)


def test_summary_time_has_phase_seconds_per_rank_and_step(analysis):
    time = time_json(analysis.metrics[1])
    assert time["counted_steps"] == [1, 2]
    assert time["phase_s"] == pytest.approx({"other": 0, "forward": 40 * US,
                                             "backward": 8 * US, "recompute": 12 * US,
                                             "grad_sync": 20 * US, "optimizer": 20 * US})
    per_step = {s["step"]: s["phase_s"] for s in time["per_step"]}
    assert per_step[1]["recompute"] == pytest.approx(12 * US)
    assert per_step[2]["grad_sync"] == 0.0


def test_front_page_shows_phases_beside_the_step(analysis):
    rows = headline_rows(analysis)
    assert phase_columns(rows) == ["forward", "backward", "recompute", "grad_sync",
                                   "optimizer"]
    # the mean of the 2 counted steps
    assert rows[0]["phases"] == {"forward": "20.0 us", "backward": "10.0 us",
                                 "grad_sync": "10.0 us", "optimizer": "10.0 us"}
    assert rows[1]["phases"]["recompute"] == "6.0 us"
