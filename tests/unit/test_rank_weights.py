"""Per-rank weights of a built call graph as columns (viz.analysis.callgraphs.rank_weights): every
node and edge keeps, read-only, exactly what each rank put there and the same total, so the drawn
graph (tooltips' top ranks, partial-rank nodes, notes of what pruning hid) is the same as from the
dicts the builder filled; the table holds one row per node or edge and rank."""
from __future__ import annotations

from viz.analysis.callgraphs.callgraph import CallGraph, _GraphBuilder, build_callgraph, prune
from viz.analysis.callgraphs.op_groups import Frame, OpGroup, total_of
from viz.analysis.callgraphs.rank_weights import RankWeights, freeze_per_rank
from viz.render.callgraph_svg import to_dot

import networkx as nx

MAIN = Frame("/work/train.py", 10, "main", "main")
STEP = Frame("/work/train.py", 20, "step", "step")
LAYER = Frame("/work/model.py", 30, "forward", "Layer.forward")
LOSS = Frame("/work/model.py", 40, "loss", "loss")


def groups() -> list:
    """Four ranks; rank 3 alone computes the loss; times that do not add up exactly in
    floating point, in an order that is not the ranks'."""
    out = []
    for rank in (2, 0, 3, 1):
        for i, (path, op, kind) in enumerate((((MAIN, STEP, LAYER), "aten.mm.default", None),
                                              ((MAIN, STEP, LAYER), "aten.add.Tensor", None),
                                              ((MAIN, STEP), "c10d.allreduce_.default",
                                               "all_reduce"))):
            out.append(OpGroup(rank, path, None, None, op, "forward", kind, "f32[4]", "m",
                               count=rank + i + 1, time_ns=1e5 * (rank + 1) + 0.1 * i,
                               bytes=64 * (i == 2), flops=3 * i))
        if rank == 3:
            out.append(OpGroup(rank, (MAIN, STEP, LOSS), None, None, "aten.sum.default",
                               "forward", None, "f32[4]", "m", 1, 7e4 + 0.3, 0, 0))
    return out


def unfrozen() -> CallGraph:
    """The same graph with the builder's dicts left as they are."""
    build = _GraphBuilder()
    for grp in groups():
        build.leaf(grp, grp.path)
    build.inclusive()
    g = nx.DiGraph()
    g.add_nodes_from((n, {"data": d}) for n, d in build.nodes.items())
    g.add_edges_from((a, b, {"data": d}) for (a, b), d in build.edges.items())
    total = total_of(d.total for d in build.nodes.values() if d.type != "function")
    return CallGraph(g, (0, 1, 2, 3), (0, 1, 2, 3), total)


def as_plain(weights) -> tuple:
    return (weights.ops, weights.time_ns, weights.bytes, weights.comms, weights.flops)


def test_frozen_weights_are_the_builders_exactly():
    frozen, plain = build_callgraph(groups(), world=range(4)), unfrozen()
    assert set(frozen.graph) == set(plain.graph)
    pairs = [(frozen.node(n), plain.node(n)) for n in plain.graph] + \
        [(frozen.edge(a, b), plain.edge(a, b)) for a, b in plain.graph.edges]
    for mine, theirs in pairs:
        assert isinstance(mine.per_rank, RankWeights) and isinstance(theirs.per_rank, dict)
        # the same ranks in the same order, the same numbers bit for bit
        assert list(mine.per_rank) == list(theirs.per_rank)
        assert [(r, as_plain(w)) for r, w in mine.per_rank.items()] == \
            [(r, as_plain(w)) for r, w in theirs.per_rank.items()]
        assert all(as_plain(mine.per_rank[r]) == as_plain(theirs.per_rank[r])
                   for r in theirs.per_rank)
        assert as_plain(mine.total) == as_plain(theirs.total)
    loss = frozen.functions("loss")[0]
    assert loss.ranks == (3,) and 0 not in loss.per_rank and loss.per_rank.get(0) is None
    # one table per graph, one row per node or edge and rank
    tables = {id(d.per_rank._table) for d, _ in pairs}
    assert len(tables) == 1
    assert len(pairs[0][0].per_rank._table.rank) == sum(len(t.per_rank) for _, t in pairs)


def test_the_drawn_graph_is_the_same_as_from_the_dicts():
    for max_nodes in (150, 4):     # everything; and pruned, with notes of what was hidden
        texts = [to_dot(prune(graph, max_nodes=max_nodes), title="t", paths={},
                        href=lambda file, line: f"{file}#{line}")
                 for graph in (build_callgraph(groups(), world=range(4)), unfrozen())]
        assert texts[0] == texts[1]
        assert "rank 0:" in texts[0]
        assert ("ranks 3 only" in texts[0]) == (max_nodes == 150)
        assert ("hidden for readability" in texts[0]) == (max_nodes == 4)


def test_counts_beyond_int64_keep_their_dicts():
    graph = unfrozen()
    node = next(iter(graph.nodes()))
    next(iter(node.per_rank.values())).flops = 1 << 70
    freeze_per_rank(graph.nodes())
    assert all(isinstance(d.per_rank, dict) for d in graph.nodes())


def test_a_pruned_graph_holds_only_its_own_rows():
    whole = build_callgraph(groups(), world=range(4))
    small = prune(whole, max_nodes=4)
    owners = small.nodes() + [small.edge(a, b) for a, b in small.graph.edges]
    tables = {id(d.per_rank._table) for d in owners}
    assert len(tables) == 1 and len(owners) < len(whole.graph) + len(whole.graph.edges)
    table = owners[0].per_rank._table
    assert len(table.rank) == sum(len(d.per_rank) for d in owners)
    assert table is not whole.nodes()[0].per_rank._table
    # the whole graph's data are not the pruned one's: dropping it frees its table
    assert all(small.node(n) is not whole.node(n) for n in small.graph if n in whole.graph)
