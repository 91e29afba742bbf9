"""The diff call graph: one call graph of two runs, each node marked added, removed, changed
or unchanged, with both runs' figures.

Nodes are matched by structure, never by line number (lines shift with every edit): a function
node by its short file path and qualified name (:func:`viz.diff.profile.function_key`), an op
leaf by its calling function, direction and communication kind (all aten ops a function issued
in one direction form one leaf, each collective kind another). A node is *changed* when its op
count, communication count, FLOPs or bytes differ; time alone never makes a node changed, it
differs on every run.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Optional

import networkx as nx

from ..analysis.callgraphs.callgraph import COMM, FUNCTION, OPS
from ..analysis.callgraphs.op_groups import OpGroup
from .profile import function_key

ADDED, REMOVED, CHANGED, UNCHANGED = "added", "removed", "changed", "unchanged"
STATUSES = (ADDED, REMOVED, CHANGED, UNCHANGED)


@dataclass
class Side:
    """One run's figures on a node or edge (inclusive: everything issued below it)."""

    ops: int = 0
    comms: int = 0
    flops: int = 0
    bytes: int = 0
    time_ns: float = 0.0

    def add(self, grp: OpGroup) -> None:
        self.ops += grp.count
        self.comms += grp.count if grp.kind else 0
        self.flops += grp.flops
        self.bytes += grp.bytes
        self.time_ns += grp.time_ns

    def structure(self) -> tuple:
        return self.ops, self.comms, self.flops, self.bytes


@dataclass
class DiffNode:
    """A function, or the ops / a collective kind one function issued in one direction."""

    id: str
    type: str                  # viz.analysis.callgraphs.callgraph FUNCTION | OPS | COMM
    name: str                  # qualified name, "ops", or the communication kind
    file: str                  # short display path
    direction: str = ""        # leaves: the phase (tracer.vocab.labels.PHASES)
    caller: str = ""           # leaves: the function key that issued them
    a: Side = field(default_factory=Side)
    b: Side = field(default_factory=Side)

    @property
    def status(self) -> str:
        if not self.a.ops and self.b.ops:
            return ADDED
        if self.a.ops and not self.b.ops:
            return REMOVED
        return CHANGED if self.a.structure() != self.b.structure() else UNCHANGED


@dataclass
class DiffGraph:
    """A diff call graph; nodes carry ``data`` (DiffNode), edges ``a`` and ``b`` (Side)."""

    scope: str
    graph: nx.DiGraph
    total_a: Side
    total_b: Side
    hidden: dict = field(default_factory=dict)   # status -> nodes left out by prune_diff

    def node(self, node_id: str) -> DiffNode:
        return self.graph.nodes[node_id]["data"]

    def nodes(self) -> list:
        return [d["data"] for _, d in self.graph.nodes(data=True)]

    def counts(self) -> dict:
        """status -> number of nodes (in this graph, plus those pruning left out)."""
        out = {s: self.hidden.get(s, 0) for s in STATUSES}
        for n in self.nodes():
            out[n.status] += 1
        return out


def build_diff_graph(scope: str, groups_a: Iterable[OpGroup], paths_a: Mapping[str, str],
                     groups_b: Iterable[OpGroup], paths_b: Mapping[str, str]) -> DiffGraph:
    """The diff call graph of run A's groups against run B's (of the same scope: a rank role,
    or all ranks). ``paths_*`` map each run's recorded files to short display paths."""
    g = nx.DiGraph()
    totals = {"a": Side(), "b": Side()}

    def node(node_id: str, **kw) -> DiffNode:
        if node_id not in g:
            g.add_node(node_id, data=DiffNode(node_id, **kw))
        return g.nodes[node_id]["data"]

    def edge(x: str, y: str, side: str) -> Side:
        if not g.has_edge(x, y):
            g.add_edge(x, y, a=Side(), b=Side())
        return g.edges[x, y][side]

    for side, groups, paths in (("a", groups_a, paths_a), ("b", groups_b, paths_b)):
        for grp in groups:
            keys = [function_key(f, paths) for f in grp.path]
            totals[side].add(grp)
            for frame, key in zip(grp.path, keys):
                node(key, type=FUNCTION, name=frame.qualname, file=paths.get(frame.file,
                                                                               frame.file))
            # A recursive function or call counts once per op, at its first occurrence.
            for key in dict.fromkeys(keys):
                getattr(g.nodes[key]["data"], side).add(grp)
            for pair in dict.fromkeys(zip(keys, keys[1:])):
                if pair[0] != pair[1]:
                    edge(*pair, side).add(grp)
            site = grp.path[-1]
            leaf_id = f"{'comm' if grp.kind else 'ops'}:{keys[-1]}:{grp.phase}:{grp.kind or ''}"
            leaf = node(leaf_id, type=COMM if grp.kind else OPS, name=grp.kind or "ops",
                        file=paths.get(site.file, site.file), direction=grp.phase,
                        caller=keys[-1])
            getattr(leaf, side).add(grp)
            edge(keys[-1], leaf_id, side).add(grp)
    return DiffGraph(scope, g, totals["a"], totals["b"])


def importance(dg: DiffGraph, data: DiffNode) -> float:
    """The largest share of either run's ops, FLOPs or bytes a node accounts for."""
    shares = [getattr(mine, m) / getattr(total, m)
              for mine, total in ((data.a, dg.total_a), (data.b, dg.total_b))
              for m in ("ops", "flops", "bytes") if getattr(total, m)]
    return max(shares, default=0.0)


def prune_diff(dg: DiffGraph, *, max_nodes: int = 120, min_share: float = 0.01) -> DiffGraph:
    """A drawable copy: changes first (most important first), each with a chain of callers up
    to a root, then unchanged nodes above ``min_share``, at most ``max_nodes`` in all.
    ``hidden`` counts, per status, what was left out."""
    g = dg.graph
    score = {n: importance(dg, g.nodes[n]["data"]) for n in g}
    changed = sorted((n for n in g if g.nodes[n]["data"].status != UNCHANGED),
                     key=lambda n: (-score[n], n))
    same = sorted((n for n in g if g.nodes[n]["data"].status == UNCHANGED and
                   score[n] >= min_share), key=lambda n: (-score[n], n))
    keep: set = set()
    for n in changed + same:
        chain = _callers(g, n, keep, score)
        if len(keep) + len(chain) <= max_nodes:
            keep.update(chain)
    hidden: dict = defaultdict(int)
    for n in g:
        if n not in keep:
            hidden[g.nodes[n]["data"].status] += 1
    return DiffGraph(dg.scope, g.subgraph(keep).copy(), dg.total_a, dg.total_b, dict(hidden))


def _callers(g: nx.DiGraph, n: str, keep: set, score: dict) -> list:
    """``n`` and its most important callers up to a root or a node already kept."""
    chain: list = []
    cur: Optional[str] = n
    while cur is not None and cur not in keep and cur not in chain:
        chain.append(cur)
        parents = [p for p in g.predecessors(cur) if p != cur]
        cur = max(parents, key=lambda p: (score[p], p)) if parents else None
    return chain
