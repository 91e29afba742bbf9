"""Diff call graph -> DOT -> SVG through graphviz ``dot`` (:func:`.callgraph_svg.render_svg`).

Drawing conventions (the legend in every SVG repeats them):
- a box per Python function (qualified name, short file), op leaves per calling function and
  direction (aten ops as notes, collectives bold), backward leaves dashed;
- the colour says what happened to the node from run A to run B: green added, red removed,
  orange changed (op count, collective count, FLOPs or bytes differ), grey unchanged;
- changed nodes show ``A -> B`` figures; added and removed nodes show their one run's figures;
- every node's tooltip has both runs' ops, collectives, bytes, FLOPs and time.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from ..analysis.callgraphs.callgraph import COMM, FUNCTION
from ..diff.diffgraph import ADDED, CHANGED, REMOVED, UNCHANGED, DiffGraph, DiffNode, Side
from ..views.formatters import fmt_bytes, fmt_count, fmt_flops, fmt_time
from .callgraph_svg import dot_text, graphviz, need_graphviz, render_svg

# status -> (border / text colour, fill)
COLOURS = {
    ADDED: ("#2e7d32", "#e8f5e9"),
    REMOVED: ("#c62828", "#ffebee"),
    CHANGED: ("#e65100", "#fff3e0"),
    UNCHANGED: ("#757575", "#ffffff"),
}


def _pair(a: float, b: float, fmt) -> str:
    return fmt(a) if a == b else f"{fmt(a)} -> {fmt(b)}"


def _figures(data: DiffNode) -> list:
    """Label lines: the node's figures, ``A -> B`` where they differ."""
    status = data.status
    if status in (ADDED, REMOVED):
        s = data.b if status == ADDED else data.a
        out = [f"{fmt_count(s.ops)} ops" + (f" · {fmt_flops(s.flops)}FLOP" if s.flops else "")]
        if s.comms:
            out.append(f"{fmt_count(s.comms)} calls · {fmt_bytes(s.bytes)}")
        return out
    a, b = data.a, data.b
    out = [f"ops {_pair(a.ops, b.ops, fmt_count)}"]
    if a.flops or b.flops:
        out.append(f"FLOP {_pair(a.flops, b.flops, fmt_flops)}")
    if a.comms or b.comms:
        out.append(f"calls {_pair(a.comms, b.comms, fmt_count)} · "
                   f"{_pair(a.bytes, b.bytes, fmt_bytes)}")
    return out


def _side_text(name: str, s: Side) -> str:
    text = f"{name}: {fmt_count(s.ops)} ops · {fmt_time(s.time_ns)}"
    if s.flops:
        text += f" · {fmt_flops(s.flops)}FLOP"
    if s.comms:
        text += f" · {fmt_count(s.comms)} collectives · {fmt_bytes(s.bytes)}"
    return text


def _tooltip(data: DiffNode) -> graphviz.quoting.NoHtml:
    head = data.name if data.type == FUNCTION else f"{data.direction} {data.name} issued by"
    return dot_text(f"{data.status.upper()}: {head}",
                  data.file if data.type == FUNCTION else data.caller,
                  _side_text("A", data.a), _side_text("B", data.b),
                  "time differences alone do not count as a change")


def _node(dot: graphviz.Digraph, node_id: str, data: DiffNode) -> None:
    colour, fill = COLOURS[data.status]
    attrs = dict(color=colour, fillcolor=fill, fontcolor=colour if data.status != UNCHANGED
                 else "#212121", tooltip=_tooltip(data), penwidth="1" if data.status ==
                 UNCHANGED else "2")
    dashed = ",dashed" if data.direction in ("backward", "recompute") else ""
    if data.type == FUNCTION:
        attrs.update(shape="box", style="rounded,filled",
                     label=dot_text(data.name, data.file, *_figures(data)))
    elif data.type == COMM:
        attrs.update(shape="box", style="filled,bold" + dashed,
                     label=dot_text(f"{data.name} ({data.direction})", *_figures(data)))
    else:   # OPS
        attrs.update(shape="note", style="filled" + dashed,
                     label=dot_text(f"{data.direction} ops", *_figures(data)))
    dot.node(node_id, **attrs)


def _legend(dot: graphviz.Digraph) -> None:
    with dot.subgraph(name="cluster_legend") as leg:
        leg.attr(label="legend", fontsize="10", color="#bdbdbd", style="rounded")
        leg.attr("node", fontsize="9", shape="box", style="rounded,filled", penwidth="2")
        texts = {ADDED: "added (only in B)", REMOVED: "removed (only in A)",
                 CHANGED: "changed: A -> B figures", UNCHANGED: "unchanged structure"}
        names = []
        for status in (ADDED, REMOVED, CHANGED, UNCHANGED):
            colour, fill = COLOURS[status]
            names.append(f"legend_{status}")
            leg.node(names[-1], label=texts[status], color=colour, fillcolor=fill,
                     fontcolor=colour)
        names.append("legend_bwd")
        leg.node(names[-1], label=dot_text("backward ops (dashed)", "collectives bold"),
                 shape="note", style="filled,dashed", fillcolor="#ffffff", penwidth="1")
        for x, y in zip(names, names[1:]):
            leg.edge(x, y, style="invis")


def to_dot(dg: DiffGraph, *, a_name: str, b_name: str) -> str:
    """DOT source of a (pruned) diff call graph."""
    counts = dg.counts()
    notes = [f"Diff call graph: {dg.scope}", f"A = {a_name}   B = {b_name}",
             " · ".join(f"{counts[s]} {s}" for s in (ADDED, REMOVED, CHANGED, UNCHANGED))]
    if dg.hidden:
        notes.append("not drawn (least important first): " +
                     ", ".join(f"{n} {s}" for s, n in sorted(dg.hidden.items())))
    need_graphviz()
    dot = graphviz.Digraph("diff")
    dot.attr(label=dot_text(*notes), labelloc="t", fontsize="14", rankdir="TB", nodesep="0.25",
             ranksep="0.35", fontname="Helvetica")
    dot.attr("node", fontname="Helvetica", fontsize="10")
    dot.attr("edge", fontname="Helvetica", fontsize="9", color="#555555", arrowsize="0.6")
    ids = {n: f"n{i}" for i, n in enumerate(sorted(dg.graph))}
    for n in sorted(dg.graph):
        _node(dot, ids[n], dg.node(n))
    for x, y in sorted(dg.graph.edges()):
        a, b = dg.graph.edges[x, y]["a"], dg.graph.edges[x, y]["b"]
        status = dg.node(y).status
        dot.edge(ids[x], ids[y], label=graphviz.nohtml(_pair(a.ops, b.ops, fmt_count)),
                 color=COLOURS[status][0],
                 style="dashed" if dg.node(y).direction in ("backward", "recompute") else "solid",
                 tooltip=dot_text(f"{dg.node(x).name} -> {dg.node(y).name}",
                                f"ops A {fmt_count(a.ops)}, B {fmt_count(b.ops)}"))
    _legend(dot)
    return dot.source


def diff_svgs(graphs: list, a_name: str, b_name: str) -> dict:
    """scope -> SVG text of each diff call graph, laid out in parallel by ``dot``."""
    sources = [to_dot(g, a_name=a_name, b_name=b_name) for g in graphs]
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip((g.scope for g in graphs), pool.map(render_svg, sources)))
