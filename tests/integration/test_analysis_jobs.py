"""The analysis on worker processes (--jobs; the unit checks:
tests/unit/test_report_memory_use.py)."""
from __future__ import annotations

import pytest
from support.constructed.workloads import Pipeline, pipeline_run
from viz.analysis import analyse
from viz.analysis.timeline.columns import Records
from viz.engine import Engine
from viz.analysis.rank import p2p_of_file
from viz.run import open_run


CFG = Pipeline(pp=2, dp=2, steps=3, microbatches=4, ops_per_pass=8)


def test_map_then_runs_on_each_result_in_task_order():
    for jobs in (1, 2):
        with Engine(jobs) as engine:
            assert engine.map(len, [("ab",), ("abc",), ("a",)], then=lambda n: -n) == \
                [-2, -3, -1]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("memory")
    pipeline_run(str(root / "traces"), CFG)
    return str(root)


@pytest.mark.parametrize("jobs", [1, 2])
def test_an_analysis_holds_one_copy_of_each_path_for_all_ranks(run, jobs):
    with Engine(jobs) as engine:
        analysis = analyse(open_run(run), engine)
    paths, frames, names = {}, {}, {}
    for mine in analysis.ranks.values():
        for g in mine.op_groups + mine.counted_op_groups:
            assert paths.setdefault(g.path, g.path) is g.path
            assert all(frames.setdefault(f, f) is f for f in g.path)
            assert names.setdefault(g.op, g.op) is g.op
    # the data-parallel replicas of a stage (ranks 0 and 2) recorded paths in common: those
    # are one object for both (above), not a copy each
    for a, b in ((0, 2), (1, 3)):
        common = {id(g.path) for g in analysis.ranks[a].op_groups} & \
            {id(g.path) for g in analysis.ranks[b].op_groups}
        assert len(common) >= 10
    # the first pass's sends and receives come as columns: one stage sends, one receives
    ends = p2p_of_file(analysis.ranks[0].path, 0)
    assert isinstance(ends, Records)
    assert len(ends) == len(p2p_of_file(analysis.ranks[1].path, 1)) == \
        2 * CFG.microbatches * CFG.steps
    assert len(analysis.timeline.links) == CFG.dp * (CFG.pp - 1) * 2 * CFG.microbatches * \
        CFG.steps
