"""The call graphs the report draws (viz.analysis.report_callgraphs) and their pages
(viz.views.callgraph_pages): ranks that did the same work (the same attribution paths, ops,
phases, shapes, modules, counts, bytes and FLOPs) share one graph, drawn once (same_work); a
rank that did anything else gets its own. Times do not split ranks. The report built from a
real run (test_report.py) checks the pages that say so."""
from __future__ import annotations

from dataclasses import replace

from viz.analysis.callgraphs.op_groups import Frame, OpGroup
from viz.analysis.report_callgraphs import report_callgraphs, same_work
from viz.views.callgraph_pages import report_views

MAIN = Frame("/work/train.py", 10, "main", "main")
STEP = Frame("/work/train.py", 20, "step", "step")


def group(rank: int, op: str = "aten.mm.default", count: int = 4, time_ns: float = 100.0,
          **kw) -> OpGroup:
    fields = dict(rank=rank, path=(MAIN, STEP), boundary=None, via=None, op=op,
                  phase="forward", kind=None, shapes="f32[4,4] f32[4,4]", module="m",
                  count=count, time_ns=time_ns, bytes=0, flops=0)
    fields.update(kw)
    return OpGroup(**fields)


def work(rank: int, *, time_scale: float = 1.0, **changed) -> list:
    """A rank's groups: an mm, an add and an all_reduce."""
    mine = [group(rank, time_ns=100 * time_scale),
            group(rank, op="aten.add.Tensor", count=2, time_ns=10 * time_scale),
            group(rank, op="c10d.allreduce_.default", kind="all_reduce", count=1, bytes=64,
                  phase="grad_sync", time_ns=50 * time_scale)]
    if changed:
        mine[0] = replace(mine[0], **changed)
    return mine


def test_ranks_with_the_same_work_share_one_graph_whatever_their_times():
    groups = {0: work(0), 1: work(1, time_scale=3.0), 2: work(2, time_scale=0.5)}
    assert same_work(groups) == [[0, 1, 2]]
    # the order of a rank's groups does not matter
    groups[1] = list(reversed(groups[1]))
    assert same_work(groups) == [[0, 1, 2]]


def test_a_rank_that_did_anything_else_gets_its_own_graph():
    for changed in (dict(count=5), dict(bytes=8), dict(shapes="f32[8,4] f32[4,4]"),
                    dict(module="other"), dict(phase="backward"), dict(path=(MAIN,)),
                    dict(op="aten.bmm.default"), dict(flops=1)):
        groups = {0: work(0), 1: work(1, **changed), 2: work(2), 3: work(3, **changed)}
        assert same_work(groups) == [[0, 2], [1, 3]], changed
    # one more group, or one fewer, is other work too
    groups = {0: work(0), 1: work(1) + [group(1, op="aten.relu.default")], 2: work(2)[:2]}
    assert same_work(groups) == [[0], [1], [2]]
    assert same_work({5: [], 7: []}) == [[5, 7]]       # nothing recorded, both


class _Analysis:
    """What report_callgraphs reads of a RunAnalysis, for groups made by hand."""

    def __init__(self, groups: dict):
        class Rank:
            def __init__(self, rank, mine):
                self.op_groups, self.steps = mine, [1]
        self.world_size = len(groups)
        self.ranks = {rank: Rank(rank, mine) for rank, mine in groups.items()}
        self.metrics = {}
        self.recorded_steps = frozenset({1})


def test_report_views_draws_one_graph_per_distinct_work_and_names_its_ranks():
    analysis = _Analysis({0: work(0), 1: work(1, time_scale=2.0), 2: work(2, count=9),
                          3: work(3, time_scale=5.0)})
    views = report_views(report_callgraphs(analysis))
    rank_pages = views.graphs[1:]
    assert [p.rel for p in rank_pages] == ["callgraphs/rank-0.html", "callgraphs/rank-2.html"]
    assert [p.ranks for p in rank_pages] == [(0, 1, 3), (2,)]
    assert {r: p.rel for r, p in views.rank_graphs.items()} == {
        0: "callgraphs/rank-0.html", 1: "callgraphs/rank-0.html",
        2: "callgraphs/rank-2.html", 3: "callgraphs/rank-0.html"}
    shared, alone = rank_pages
    assert shared.title.startswith("Call graph: ranks 0-1, 3 (the same work)")
    assert "rank 0's" in shared.note and "Ranks 0-1, 3 did the same work" in shared.note
    assert alone.title.startswith("Call graph: rank 2,") and not alone.note
    # the shared graph is rank 0's: its ops and times, not a sum over the ranks it stands for
    assert shared.graph.ranks == (0,) and shared.graph.total.ops == 4 + 2 + 1
    assert shared.graph.total.time_ns == 160
    assert alone.graph.total.ops == 9 + 2 + 1


def test_report_views_keep_the_merged_graphs_pruned_and_their_functions():
    """The unpruned merged graphs are dropped once drawn pruned (tens of MiB for many ranks):
    the views keep every pruned page and, of the unpruned whole-recording graph, its functions
    and what they issued."""
    from viz.analysis.callgraphs.callgraph import FUNCTION, CallGraph, build_callgraph
    groups = {0: work(0), 1: work(1, time_scale=2.0), 2: work(2, count=9)}
    views = report_views(report_callgraphs(_Analysis(groups)))
    graphs = [p.graph for p in views.graphs] + [p.graph for p in views.zooms.values()] + \
        [p.graph for p in views.module_zooms.values()]
    assert all(g.hidden is not None for g in graphs)           # pruned, every one
    assert not [v for v in vars(views).values() if isinstance(v, CallGraph)]
    full = build_callgraph([g for r in sorted(groups) for g in groups[r]], world=range(3))
    assert [(f.id, f.file, f.name, f.line, f.total) for f in views.functions] == \
        [(d.id, d.file, d.name, d.line, d.total) for d in full.nodes(FUNCTION)]
    assert {f.name for f in views.functions} == {"main", "step"}


def test_labels_and_tooltips_are_bounded_for_graphviz():
    """A site of 3,000 op kinds, one named like a templated CUDA kernel of 2,000 characters
    (HTA's trace_diff export: 30 kinds, up to 1,000 characters each): before, its tooltip
    listed every one, past graphviz's 16,384-character quoted string (issue 50)."""
    import re

    from viz.analysis.callgraphs.callgraph import build_callgraph
    from viz.render.callgraph_svg import to_dot
    from viz.views.formatters import bounded_lines, first_of
    groups = [group(0, op=f"aten.op_number_{i}.default", count=3000 - i) for i in range(3000)]
    groups.append(group(0, op="void kernel<" + "float, " * 285 + ">", count=5000))
    dot = to_dot(build_callgraph(groups, world=[0]), title="many ops", paths={},
                 href=lambda file, line: None)
    quoted = re.findall(r'"((?:[^"\\]|\\.)*)"', dot)
    assert max(len(q.encode()) for q in quoted) < 4_000
    assert "ops: void kernel<float, float" in dot and "more characters)" in dot
    assert "op_number_0 x3000, op_number_1 x2999" in dot and "and 2,989 more op kinds" in dot
    assert first_of(["a", "b", "c"], 2, "ops") == ["a", "b", "and 1 more ops"]
    assert first_of(["a", "b"], 2) == ["a", "b"]
    assert bounded_lines(["x" * 10], line_most=4) == ["xxxx... (6 more characters)"]
    assert bounded_lines([str(i) for i in range(5)], lines_most=3) == \
        ["0", "1", "2", "and 2 more lines"]


def test_a_rank_that_counts_other_steps_is_recounted_and_only_it(tmp_path):
    """The training steps are every step some rank's time metrics count: here rank 0 counts
    steps 1-2 (0 is setup, 3 unfinished) and rank 1 only step 1 (its step 2 is unfinished), so
    rank 1's trace is read again over steps 1-2 and rank 0 keeps its own counted groups; the
    setup graph holds what steps 0 and 3 did."""
    from support.constructed_timelines import analysed, synthetic
    from viz.analysis.report_callgraphs import (StepSplit, recounts, step_split, to_recount,
                                                training)
    stack = [("train.py", 12, "step", "step"), ("train.py", 30, "main", "main")]
    ranks = []
    for rank, steps, closed in ((0, 4, 3), (1, 3, 2)):
        r = synthetic(rank, 2)
        for step in range(steps):
            r.op(100 * step, 100 * step + 10, stack=stack, module="Net.fc")
            r.op(100 * step + 10, 100 * step + 15, name="aten.add.Tensor", stack=stack,
                 module="Net.fc")
            if step < closed:
                r.next_step(100 * step + 50)
        ranks.append(r)
    analysis = analysed(tmp_path, ranks)
    assert step_split(analysis) == StepSplit(counted=(1, 2), other=(0, 3))
    assert to_recount(analysis, frozenset({1, 2})) == {1} and recounts(analysis)
    counted = training(analysis)
    assert counted.ranks[0].op_groups is analysis.ranks[0].counted_op_groups
    # one mm and one add a step, over steps 1 and 2 on both ranks
    assert {(g.rank, g.op): g.count for r in counted.ranks.values() for g in r.op_groups} == {
        (0, "aten.mm.default"): 2, (0, "aten.add.Tensor"): 2,
        (1, "aten.mm.default"): 2, (1, "aten.add.Tensor"): 2}
    graphs = report_callgraphs(analysis, counted)
    assert graphs.setup is not None and graphs.setup.total.ops == 2 * (2 + 1)   # 0, 3; 0
    assert graphs.merged.total.ops == 2 * (2 + 2)
