"""Which ranks share a call graph (viz.views.callgraph_pages.same_work): ranks that did the same
work (the same attribution paths, ops, phases, shapes, modules, counts, bytes and FLOPs) get one
graph, drawn once; a rank that did anything else gets its own. Times do not split ranks. The
report built from a real run (test_report.py) checks the pages that say so."""
from __future__ import annotations

from dataclasses import replace

from viz.analysis.callgraphs.op_groups import Frame, OpGroup
from viz.views.callgraph_pages import report_views, same_work

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
    """What report_views reads of a RunAnalysis, for groups made by hand."""

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
    views = report_views(analysis)
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
    views = report_views(_Analysis(groups))
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
