"""What the report process holds of many ranks grows with their distinct call sites, not with
the ranks: each rank's op groups, as its result comes in from a worker, are rebuilt on one
shared copy of the frames, paths and names (viz.analysis.callgraphs.op_groups.SharedOpGroups,
applied through Engine.map's ``then``); the sends and receives of the first pass arrive as
columns."""
from __future__ import annotations

import pickle

import pytest

from support.constructed.workloads import Pipeline, pipeline_run
from viz.analysis import analyse
from viz.analysis.callgraphs.op_groups import NO_STACK, Frame, OpGroup, SharedOpGroups
from viz.run import open_run

CFG = Pipeline(pp=2, dp=2, steps=3, microbatches=4, ops_per_pass=8)
MAIN = Frame("/work/train.py", 10, "main", "main")
STEP = Frame("/work/train.py", 20, "step", "step")
LIB = Frame("/lib/torch/functional.py", 5, "linear", "linear")


def rank_groups(rank: int) -> list:
    """A rank's groups as a worker's result brings them: copies of their own."""
    groups = [OpGroup(rank, (MAIN, STEP), LIB, None, "aten.mm.default", "forward", None,
                      "f32[4,4]", "m.l", 2, 10.0 * rank, 0, 128),
              OpGroup(rank, (MAIN, STEP), None, ((STEP,)), "aten.mm.default", "backward", None,
                      "f32[4,4]", "m.l", 2, 20.0, 0, 256),
              OpGroup(rank, (NO_STACK,), None, None, "c10d.allreduce_.default", "grad_sync",
                      "all_reduce", "f32[8]", None, 1, 5.0, 32, 0)]
    return pickle.loads(pickle.dumps(groups))


def test_equal_frames_paths_and_names_become_one_copy():
    shared = SharedOpGroups()
    before = {rank: rank_groups(rank) for rank in range(3)}
    assert before[0][0].path is not before[1][0].path          # what pickling gives
    after = {rank: shared.of(groups) for rank, groups in before.items()}
    assert after == before                                     # the same values
    for rank in (1, 2):
        for mine, first in zip(after[rank], after[0]):
            for field in ("path", "boundary", "via", "op", "phase", "kind", "shapes", "module"):
                assert getattr(mine, field) is getattr(first, field), field
    # NO_STACK is itself again, as `frame is NO_STACK` tests expect
    assert all(g.path[0] is NO_STACK for groups in after.values() for g in groups[2:])


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("memory")
    pipeline_run(str(root / "traces"), CFG)
    return str(root)


def test_groups_trimmed_together_share_each_trimmed_path():
    from viz.analysis.callgraphs.callgraph import trim_common_prefix
    leaf = Frame("/work/model.py", 30, "forward", "Layer.forward")
    path = (MAIN, STEP, leaf)
    groups = [OpGroup(rank, path, None, None, "aten.mm.default", "forward", None, None, None,
                      1, 1.0, 0, 0) for rank in range(4)]
    groups.append(OpGroup(0, (MAIN, STEP), None, None, "aten.add.Tensor", "forward", None, None,
                          None, 1, 1.0, 0, 0))
    trimmed = trim_common_prefix(groups)
    assert [g.path for g in trimmed[:4]] == [(STEP, leaf)] * 4
    assert len({id(g.path) for g in trimmed[:4]}) == 1
    assert trimmed[4].path == (STEP,)


def test_a_page_written_in_pieces_is_the_page_rendered_whole(tmp_path):
    from viz.render.page_writer import PageWriter
    writer = PageWriter(str(tmp_path))
    svg = "<svg>" + "<g/>" * 10_000 + "</svg>"
    context = dict(title="Timeline", svg=svg, files={"svg": "t.svg", "chrome_trace": "t.json"})
    path = writer.write("sub/timeline.html", "timeline.html", **context)
    whole = writer.env.get_template("timeline.html").render(root="../", script="svgview.js",
                                                             **context)
    assert open(path, encoding="utf-8").read() == whole and svg in whole


def test_metrics_build_passes_and_p2p_times_one_step_at_a_time(run):
    from viz.analysis.timeline.metrics import _Index
    analysis = analyse(open_run(run))
    timeline = analysis.timeline
    index = _Index(timeline)
    steps = sorted({s for lane in timeline.ranks.values() for s in lane.steps})
    for step in steps:
        for rank, lane in timeline.ranks.items():
            mine = [p for p in lane.passes if p.step == step]
            assert ((rank, step) in index.passes) == bool(mine)
            assert index.passes.get((rank, step), []) == mine
            recv = [c for c in lane.comm if c.kind == "recv" and c.step == step]
            assert index.recvs.get((rank, step), ([], [])) == \
                ([c.start for c in recv], [c.end for c in recv])
            assert index.sends.get((rank, step), []) == sorted(
                c.start for c in lane.comm if c.kind == "send" and c.step == step)
        # only this step's entries are held
        assert {s for _, s in index.passes._kept} <= {step}
        assert len(index.passes._kept) <= len(timeline.ranks)
    assert sum(len(lane.passes) for lane in timeline.ranks.values()) == \
        CFG.dp * CFG.pp * CFG.steps * CFG.microbatches * 2
