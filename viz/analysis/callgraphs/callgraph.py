"""Call graphs: where in the user's code every op and collective of a run comes from.

Built from :mod:`viz.analysis.callgraphs.op_groups` (one rank's events aggregated by attribution
path):

1. :func:`build_callgraph` turns groups (of one rank, or of all ranks merged) into a networkx
   DiGraph: a node per Python function, edges caller -> callee weighted by ops, time, bytes and
   FLOPs (inclusive, per rank and per direction), and op leaves per call site: one for the aten
   ops of a site and direction, one per collective kind.
2. :func:`prune` keeps the graph readable: nodes below a share of ops / time / bytes are hidden
   (each parent notes what it lost) and at most ``max_nodes`` remain.

:func:`source_lines` gives, per source line, what it issued directly and through its calls.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Optional, Sequence

import networkx as nx

from tracer.vocab.strenum import StrEnum

from .op_groups import Frame, MEASURES, NO_STACK, OpGroup, Path, Weights, total_of
from .rank_weights import freeze_per_rank, total_over_ranks
from .source_files import definition_line


class NodeType(StrEnum):
    """What a call-graph node is: a function, the ops or a collective of a call site, or a
    note of what pruning hid."""

    FUNCTION = "function"
    OPS = "ops"
    COMM = "comm"
    HIDDEN = "hidden"


FUNCTION, OPS, COMM, HIDDEN = NodeType.FUNCTION, NodeType.OPS, NodeType.COMM, NodeType.HIDDEN


# ------------------------------------------------------------------------------ the graph
@dataclass
class NodeData:
    """A call-graph node: a function, the ops or a collective of a call site, or a note of what
    pruning hid. Weights are inclusive (everything issued below the node). Once the graph is
    built, ``per_rank`` is a read-only :class:`viz.analysis.callgraphs.rank_weights.RankWeights`."""

    id: str
    type: NodeType
    file: str
    line: int                  # functions: definition line; leaves: the call site
    name: str                  # functions: qualname; comm leaves: the kind
    direction: str = ""        # leaves: the phase (tracer.vocab.labels.PHASES)
    kind: Optional[str] = None
    per_rank: Mapping[int, Weights] = field(default_factory=lambda: defaultdict(Weights))
    by_direction: defaultdict[str, Weights] = field(default_factory=lambda: defaultdict(Weights))
    # Plain dicts, not Counters: a big run builds hundreds of thousands of nodes.
    ops: dict[str, int] = field(default_factory=dict)      # leaves: op -> calls
    # leaves: (op, shapes) -> calls
    shapes: dict[tuple[str, Optional[str]], int] = field(default_factory=dict)
    boundaries: dict[Frame, int] = field(default_factory=dict)  # leaves: library call -> calls
    via: dict[Path, int] = field(default_factory=dict)  # backward leaves: live frames -> calls
    hidden: int = 0            # HIDDEN notes: how many nodes it stands for

    @property
    def total(self) -> Weights:
        return total_over_ranks(self.per_rank)

    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(sorted(r for r, w in self.per_rank.items() if w.ops))


@dataclass
class EdgeData:
    """Caller -> callee (or function -> op leaf): what flowed through the calls."""

    per_rank: Mapping[int, Weights] = field(default_factory=lambda: defaultdict(Weights))
    by_direction: defaultdict[str, Weights] = field(default_factory=lambda: defaultdict(Weights))
    lines: set[int] = field(default_factory=set)   # call-site lines in the caller

    @property
    def total(self) -> Weights:
        return total_over_ranks(self.per_rank)


@dataclass
class Hidden:
    """What pruning left out of a graph."""

    functions: int = 0
    sites: int = 0
    ops: int = 0
    time_ns: float = 0
    bytes: int = 0


@dataclass
class CallGraph:
    """A call graph over some ranks. ``graph`` nodes and edges carry ``data`` (NodeData /
    EdgeData); ``total`` is everything its op leaves account for."""

    graph: nx.DiGraph
    ranks: tuple[int, ...]
    world: tuple[int, ...]
    total: Weights
    hidden: Optional[Hidden] = None

    def node(self, node_id: str) -> NodeData:
        return self.graph.nodes[node_id]["data"]

    def edge(self, caller: str, callee: str) -> EdgeData:
        return self.graph.edges[caller, callee]["data"]

    def nodes(self, type_: Optional[NodeType] = None) -> list[NodeData]:
        return [d["data"] for _, d in self.graph.nodes(data=True)
                if type_ is None or d["data"].type == type_]

    def functions(self, qualname: str) -> list[NodeData]:
        """Function nodes of that qualified name."""
        return [n for n in self.nodes(FUNCTION) if n.name == qualname]


def function_id(frame: Frame) -> str:
    return f"fn:{frame.file}:{frame.qualname}"


def _leaf_id(site: Frame, direction: str, kind: Optional[str]) -> str:
    return f"{'comm' if kind else 'ops'}:{site.file}:{site.line}:{direction}:{kind or ''}"


def build_callgraph(groups: Iterable[OpGroup], *, world: Sequence[int] = (),
                    root: Optional[tuple[str, str]] = None) -> CallGraph:
    """The call graph of ``groups`` (one rank's, or several ranks' merged).

    ``root`` = (file, qualname) keeps only ops issued below that function and starts every path
    there (a zoomed subgraph). ``world`` lists the run's ranks, to tell which ranks reach a node.
    """
    build = _GraphBuilder()
    ranks: set[int] = set()
    for grp in groups:
        frames = grp.path
        if root is not None:
            start = next((i for i, f in enumerate(frames) if (f.file, f.qualname) == root), None)
            if start is None:
                continue
            frames = frames[start:]
        ranks.add(grp.rank)
        build.leaf(grp, frames)
    build.inclusive()
    nodes, edges = build.nodes, build.edges
    freeze_per_rank(list(nodes.values()) + list(edges.values()))
    g = nx.DiGraph()
    g.add_nodes_from((node_id, {"data": data}) for node_id, data in nodes.items())
    g.add_edges_from((a, b, {"data": data}) for (a, b), data in edges.items())
    total = total_of(d.total for d in nodes.values() if d.type != FUNCTION)
    return CallGraph(g, tuple(sorted(ranks)), tuple(world) or tuple(sorted(ranks)), total)


class _GraphBuilder:
    """Nodes and edges in plain dicts, handed to networkx at the end (its views cost more per
    lookup): leaves and their callers first, then inclusive weights of every function."""

    def __init__(self) -> None:
        self.nodes: dict[str, NodeData] = {}
        self.edges: dict[tuple[str, str], EdgeData] = {}
        # (rank, frames) -> direction -> weights
        self.paths: defaultdict[tuple[int, Path], defaultdict[str, Weights]] = \
            defaultdict(lambda: defaultdict(Weights))

    def node(self, node_id: str, **kw: Any) -> NodeData:
        data = self.nodes.get(node_id)
        if data is None:
            data = self.nodes[node_id] = NodeData(node_id, **kw)
        return data

    def edge(self, a: str, b: str) -> EdgeData:
        data = self.edges.get((a, b))
        if data is None:
            data = self.edges[(a, b)] = EdgeData()
        return data

    def leaf(self, grp: OpGroup, frames: Path) -> None:
        """The group's leaf (ops or a collective at its source line) and the edge from the
        function that issued it."""
        w = grp.weights()
        site = frames[-1]
        lid = _leaf_id(site, grp.phase, grp.kind)
        leaf = self.node(lid, type=COMM if grp.kind else OPS, file=site.file, line=site.line,
                         name=grp.kind or "ops", direction=grp.phase, kind=grp.kind)
        leaf.per_rank[grp.rank].add(w)
        leaf.by_direction[grp.phase].add(w)
        n = grp.count
        leaf.ops[grp.op] = leaf.ops.get(grp.op, 0) + n
        shape_key = (grp.op, grp.shapes)
        leaf.shapes[shape_key] = leaf.shapes.get(shape_key, 0) + n
        if grp.boundary is not None:
            leaf.boundaries[grp.boundary] = leaf.boundaries.get(grp.boundary, 0) + n
        if grp.via is not None:
            leaf.via[grp.via] = leaf.via.get(grp.via, 0) + n
        fid = function_id(site)
        if fid not in self.nodes:
            self.node(fid, type=FUNCTION, file=site.file, line=site.line, name=site.qualname)
        e = self.edge(fid, lid)
        e.per_rank[grp.rank].add(w)
        e.by_direction[grp.phase].add(w)
        e.lines.add(site.line)
        self.paths[(grp.rank, frames)][grp.phase].add(w)

    def inclusive(self) -> None:
        """Inclusive weights through a trie of the paths: paths share long prefixes, so
        summing each prefix once is far cheaper than walking every path."""
        trie: dict[tuple[int, Frame], int] = {}          # (parent index, frame) -> index
        parents: list[int] = []
        frames_of: list[Frame] = []
        fn_paths: list[tuple[str, ...]] = []
        # index -> (rank, direction) -> weights
        at_node: defaultdict[int, defaultdict[tuple[int, str], Weights]] = \
            defaultdict(lambda: defaultdict(Weights))
        lowest_line: dict[str, int] = {}
        for (rank, frames), by_direction in self.paths.items():
            index = -1
            for frame in frames:
                key = (index, frame)
                child = trie.get(key)
                if child is None:
                    child = trie[key] = len(parents)
                    fid = function_id(frame)
                    fn_paths.append((fn_paths[index] if index >= 0 else ()) + (fid,))
                    parents.append(index)
                    frames_of.append(frame)
                    self.node(fid, type=FUNCTION, file=frame.file, line=frame.line,
                              name=frame.qualname)
                    lowest_line[fid] = min(lowest_line.get(fid, frame.line), frame.line)
                index = child
            for direction, w in by_direction.items():
                at_node[index][(rank, direction)].add(w)
        self.paths.clear()          # a merged graph of many ranks: memory for what follows
        for index in range(len(parents) - 1, -1, -1):     # children were created after parents
            parent = parents[index]
            if parent >= 0 and index in at_node:
                for rank_direction, w in at_node[index].items():
                    at_node[parent][rank_direction].add(w)
        for index, fns in enumerate(fn_paths):
            if index in at_node:
                self._credit(fns, frames_of[parents[index]].line if len(fns) >= 2 else None,
                             at_node.pop(index))
        for fid, low in lowest_line.items():
            data = self.nodes[fid]
            data.line = definition_line(data.file, data.name, low)

    def _credit(self, fns: tuple[str, ...], call_line: Optional[int],
                weights: dict[tuple[int, str], Weights]) -> None:
        """Add the inclusive ``weights`` of one call path ``fns`` to its function and to the
        edge from its caller (called at ``call_line``: None without a caller)."""
        fid = fns[-1]
        # A recursive call is already counted at its outermost occurrence.
        add_node = fid not in fns[:-1]
        pair = (fns[-2], fns[-1]) if len(fns) >= 2 else None
        add_edge = pair is not None and not any(fns[i:i + 2] == pair
                                                for i in range(len(fns) - 2))
        if pair is not None and call_line is not None:
            self.edge(*pair).lines.add(call_line)
        data = self.nodes[fid]
        for (rank, direction), w in weights.items():
            if add_node:
                data.per_rank[rank].add(w)
                data.by_direction[direction].add(w)
            if add_edge and pair is not None:
                e = self.edges[pair]
                e.per_rank[rank].add(w)
                e.by_direction[direction].add(w)


# ------------------------------------------------------------------------------ pruning
def importance(cg: CallGraph, data: NodeData, measures: Sequence[str] = MEASURES) -> float:
    """The largest share of the graph's ops / time / bytes a node accounts for."""
    w = data.total
    shares = [w.get(m) / cg.total.get(m) for m in measures if cg.total.get(m)]
    return max(shares, default=0.0)


def prune(cg: CallGraph, *, max_nodes: int = 150, min_share: float = 0.005,
          measures: Sequence[str] = MEASURES) -> CallGraph:
    """A readable copy: nodes below ``min_share`` of every measure go, at most ``max_nodes``
    nodes stay (notes included); each parent that lost children gets a HIDDEN note saying what
    they held, and ``hidden`` sums up what the graph no longer shows."""
    g = cg.graph
    score = {n: importance(cg, g.nodes[n]["data"], measures) for n in g}
    order = sorted(g, key=lambda n: (-score[n], n))
    budget = max_nodes
    while True:
        keep = _select(g, order, score, budget, min_share)
        notes = sum(1 for n in keep if any(c not in keep for c in g.successors(n)))
        if len(keep) + notes <= max_nodes or budget <= 1:
            break
        budget -= len(keep) + notes - max_nodes
    out = g.subgraph(keep).copy()
    # Copies of the kept nodes' and edges' data, their per-rank weights in a table of their own
    # (below): the pruned graph does not hold the whole graph's table once that is dropped.
    for _, attrs in out.nodes(data=True):
        attrs["data"] = replace(attrs["data"])
    for _, _, attrs in out.edges(data=True):
        attrs["data"] = replace(attrs["data"])
    for parent in sorted(keep):
        lost = [c for c in g.successors(parent) if c not in keep]
        if not lost:
            continue
        note = NodeData(f"hidden:{parent}", HIDDEN, "", 0, "hidden", hidden=len(lost))
        for child in lost:
            e = g.edges[parent, child]["data"]
            for rank, w in e.per_rank.items():
                note.per_rank[rank].add(w)
            for direction, w in e.by_direction.items():
                note.by_direction[direction].add(w)
        out.add_node(note.id, data=note)
        out.add_edge(parent, note.id, data=EdgeData(note.per_rank, note.by_direction))
    freeze_per_rank([d["data"] for _, d in out.nodes(data=True)]
                    + [d["data"] for _, _, d in out.edges(data=True)])
    hidden = Hidden()
    for n in g:
        if n in keep:
            continue
        data = g.nodes[n]["data"]
        if data.type == FUNCTION:
            hidden.functions += 1
        else:
            hidden.sites += 1
            w = data.total
            hidden.ops += w.ops
            hidden.time_ns += w.time_ns
            hidden.bytes += w.bytes
    return CallGraph(out, cg.ranks, cg.world, cg.total, hidden)


def _select(g: nx.DiGraph, order: list[str], score: dict[str, float], budget: int,
            min_share: float) -> set[str]:
    """The most important nodes, each with a chain of ancestors up to a root (connected)."""
    keep: set[str] = set()
    for n in order:
        if len(keep) >= budget or score[n] < min_share:
            break
        chain: list[str] = []
        cur = n
        while cur not in keep and cur not in chain:
            chain.append(cur)
            parents = [p for p in g.predecessors(cur) if p != cur]
            if not parents:
                break
            cur = max(parents, key=lambda p: (score[p], p))
        if len(keep) + len(chain) <= budget:
            keep.update(chain)
    return keep


def trim_common_prefix(groups: Sequence[OpGroup]) -> list[OpGroup]:
    """Groups with the frames every path shares (``<module>`` -> main -> train ...) removed,
    keeping at least the last shared one, so a subgraph starts where its paths diverge."""
    kept = list(groups)
    if not kept:
        return kept
    first = kept[0].path
    n = len(first)
    for grp in kept[1:]:
        n = min(n, len(grp.path))
        for i in range(n):
            if (grp.path[i].file, grp.path[i].qualname) != (first[i].file, first[i].qualname):
                n = i
                break
    cut = max(n - 1, 0)
    if not cut:
        return kept
    trimmed: dict[Path, Path] = {}   # one trimmed copy of each path, however many groups share it
    return [replace(grp, path=trimmed.setdefault(grp.path, grp.path[cut:])) for grp in kept]


# ------------------------------------------------------------------------------ per line
@dataclass
class LineOps:
    """What one source line issued: ``direct`` by (op, direction): ops whose innermost user
    frame is this line; ``through`` by direction: compute ops issued by the calls it made;
    ``comm`` by (kind, direction): collectives, issued directly or through calls."""

    direct: defaultdict[tuple[str, str], Weights] = field(
        default_factory=lambda: defaultdict(Weights))
    through: defaultdict[str, Weights] = field(default_factory=lambda: defaultdict(Weights))
    comm: defaultdict[tuple[str, str], Weights] = field(
        default_factory=lambda: defaultdict(Weights))
    ranks: set[int] = field(default_factory=set)


def source_lines(groups: Iterable[OpGroup]) -> defaultdict[str, defaultdict[int, LineOps]]:
    """file -> {line -> LineOps} over the attribution paths of ``groups``.

    A row-parallel forward line holds the all-reduce its helper issues, and a column-parallel
    forward line the backward all-reduce of the autograd node it created."""
    out: defaultdict[str, defaultdict[int, LineOps]] = defaultdict(lambda: defaultdict(LineOps))
    for grp in groups:
        w = grp.weights()
        seen: set[tuple[str, int]] = set()
        for depth, frame in enumerate(reversed(grp.path)):   # innermost first
            key = (frame.file, frame.line)
            if key in seen or frame is NO_STACK:
                continue
            seen.add(key)
            entry = out[frame.file][frame.line]
            entry.ranks.add(grp.rank)
            if grp.kind:
                entry.comm[(grp.kind, grp.phase)].add(w)
            if depth == 0:
                entry.direct[(grp.op, grp.phase)].add(w)
            elif not grp.kind:
                entry.through[grp.phase].add(w)
    return out
