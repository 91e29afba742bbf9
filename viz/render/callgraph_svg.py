"""Call graph -> DOT -> SVG through graphviz ``dot``.

Drawing conventions (the legend in every SVG repeats them):
- a box per Python function: qualified name, file:line of its definition, inclusive ops, time
  and bytes; the fill darkens with its share of the graph's time;
- op leaves per call site: aten ops (note shape) and collectives (communication colour, bold);
  backward leaves are dashed: they hang under the forward source that created their autograd
  node; recompute leaves (checkpointing's replay inside backward) are dashed too; the fill of
  an ops leaf tells its phase (PHASE_FILL: recompute lilac, grad_sync green, optimizer amber);
- a node reached by only some of the graph's ranks is purple and says which ranks;
- grey notes say what pruning hid below a node;
- edges: ops (and bytes) that flowed through the call, width by share of time;
- every node links to its source page and has a tooltip with counts, time, bytes and shapes.
"""
from __future__ import annotations

from typing import Callable, Mapping, Optional

try:
    import graphviz
except ImportError:       # a machine without it still reads runs and writes summary.json;
    graphviz = None       # drawing says so (RenderError)

from tracer.vocab.labels import PHASES

from ..analysis.callgraphs.callgraph import (COMM, CallGraph, EdgeData, FUNCTION, HIDDEN, NodeData,
                                             OPS)
from ..analysis.callgraphs.op_groups import Weights
from ..views.formatters import (ITEM_MOST, bounded_lines, cut, first_of, fmt_bytes,
                                fmt_count, fmt_flops, fmt_ranks, fmt_time, short_op)

COMM_COLOUR = "#1565c0"
COMM_FILL = "#e3eefc"
PARTIAL_COLOUR = "#7b1fa2"
HIDDEN_COLOUR = "#9e9e9e"
# phases drawn dashed (run by the autograd engine) and the fill of an ops leaf per phase
DASHED_PHASES = frozenset(("backward", "recompute"))
PHASE_FILL = {"forward": "#fafafa", "backward": "#fafafa", "recompute": "#f3e5f5",
              "grad_sync": "#e8f5e9", "optimizer": "#fff3e0", "other": "#eeeeee"}
TOP_OPS = 3          # ops listed in a leaf's label (the tooltip lists 12: views.formatters)
TOP_SHAPES = 8       # shape signatures in a leaf's tooltip
TOP_RANKS = 16       # per-rank lines in a merged graph's tooltips

Href = Callable[[str, int], Optional[str]]


class RenderError(Exception):
    """Rendering failed (graphviz missing or broken); the message is one line. The commands
    take it as bad input (graphviz is the user's to install): one line on stderr, no
    traceback."""


class DotFailed(RenderError):
    """graphviz's ``dot`` ran and failed on one picture: the others can still be drawn."""


def need_graphviz() -> None:
    """RenderError (one line) where the graphviz Python package is missing."""
    if graphviz is None:
        raise RenderError("the graphviz Python package is not installed: pip install graphviz")


def _esc(text: str) -> str:
    """Text for a DOT escString (we join lines with DOT's own ``\\n``)."""
    return str(text).replace("\\", "\\\\")


def dot_text(*lines: Optional[str]) -> graphviz.quoting.NoHtml:
    """Lines for a DOT label or tooltip, bounded (views.formatters.bounded_lines): graphviz
    refuses a string over 16,384 bytes, and a Kineto export's op site can hold thousands of
    op kinds."""
    kept = bounded_lines(line for line in lines if line is not None)
    return graphviz.nohtml("\\n".join(_esc(line) for line in kept))



def _weights_text(w: Weights) -> str:
    text = f"{fmt_count(w.ops)} ops · {fmt_time(w.time_ns)}"
    if w.bytes:
        text += f" · {fmt_bytes(w.bytes)}"
    return text


class _Drawer:
    """Builds one DOT graph. Nodes get ids n0, n1... in an order that only depends on what is
    displayed (not on absolute paths), so the DOT text is the same on every machine."""

    def __init__(self, cg: CallGraph, paths: Mapping[str, str], href: Href,
                 links: Mapping[str, str]):
        self.cg, self.paths, self.href, self.links = cg, paths, href, links
        self.order = sorted(cg.graph, key=self._key)
        self.ids = {node: f"n{i}" for i, node in enumerate(self.order)}

    def _key(self, node_id: str) -> tuple:
        data = self.cg.node(node_id)
        if data.type == HIDDEN:
            parent = next(iter(self.cg.graph.predecessors(node_id)), None)
            return self._key(parent) + (1,) if parent else ("",)
        return (self.paths.get(data.file, data.file), data.name, data.line, data.type,
                data.direction, data.kind or "", 0)

    def where(self, file: str, line: int) -> str:
        return f"{self.paths.get(file, file)}:{line}"

    def partial(self, data: NodeData) -> Optional[str]:
        ranks = data.ranks
        if len(self.cg.ranks) > 1 and ranks and set(ranks) != set(self.cg.ranks):
            return f"ranks {fmt_ranks(ranks)} only"
        return None

    def heat(self, w: Weights) -> int:
        share = w.time_ns / self.cg.total.time_ns if self.cg.total.time_ns else 0.0
        return 1 + min(7, int(share * 8))

    def tooltip(self, data: NodeData) -> graphviz.quoting.NoHtml:
        lines = []
        if data.type == FUNCTION:
            lines += [data.name, f"defined at {self.where(data.file, data.line)}"]
        elif data.type == HIDDEN:
            lines += [f"{data.hidden} callees / call sites hidden (below the pruning share)"]
        else:
            lines += [f"{data.direction} {data.name} at {self.where(data.file, data.line)}"]
        for direction in PHASES:
            w = data.by_direction.get(direction)
            if w and w.ops:
                text = f"{direction}: {_weights_text(w)}"
                if w.comms:
                    text += f" · {fmt_count(w.comms)} collectives"
                if w.flops:
                    text += f" · {fmt_flops(w.flops)}FLOP"
                lines.append(text)
        if len(self.cg.ranks) > 1:
            lines.append(f"ranks: {fmt_ranks(data.ranks)} of {fmt_ranks(self.cg.ranks)}")
            for rank in data.ranks[:TOP_RANKS]:
                lines.append(f"  rank {rank}: {_weights_text(data.per_rank[rank])}")
        if data.ops:
            ops = sorted(data.ops.items(), key=lambda kv: (-kv[1], kv[0]))
            lines.append("ops: " + ", ".join(first_of(
                [f"{cut(short_op(op), ITEM_MOST)} x{n}" for op, n in ops], what="op kinds")))
        for (op, shapes), n in sorted(data.shapes.items(),
                                      key=lambda kv: (-kv[1], kv[0][0], kv[0][1] or ""))[
                                          :TOP_SHAPES]:
            lines.append(f"  {cut(short_op(op), ITEM_MOST)} {shapes or '(no tensors)'} x{n}")
        for frame, n in sorted(data.boundaries.items(), key=lambda kv: -kv[1])[:3]:
            lines.append(f"calls {frame.qualname} ({self.paths.get(frame.file, frame.file)})")
        for frames, n in sorted(data.via.items(), key=lambda kv: -kv[1])[:3]:
            lines.append("run by " + " -> ".join(f"{f.qualname}:{f.line}" for f in frames))
        return dot_text(*lines)

    def node(self, dot: graphviz.Digraph, data: NodeData, link_to: NodeData) -> None:
        attrs = {"tooltip": self.tooltip(data), "target": "_top"}
        url = self.links.get(data.id) or (self.href(link_to.file, link_to.line)
                                          if link_to.file else None)
        if url:
            attrs["URL"] = url
        w = data.total
        partial = self.partial(data)
        if data.type == FUNCTION:
            heat = self.heat(w)
            attrs.update(shape="box", style="rounded,filled", fillcolor=f"/oranges9/{heat}",
                         fontcolor="white" if heat >= 7 else "black",
                         label=dot_text(data.name, self.where(data.file, data.line),
                                      _weights_text(w), partial))
        elif data.type == COMM:
            attrs.update(shape="box", style="filled,bold" + (",dashed" if data.direction in
                                                           DASHED_PHASES else ""),
                         color=COMM_COLOUR, fillcolor=COMM_FILL, fontcolor=COMM_COLOUR,
                         label=dot_text(f"{data.kind} x{fmt_count(w.comms)} ({data.direction})",
                                      f"{fmt_bytes(w.bytes)} · {fmt_time(w.time_ns)}",
                                      f"at {self.where(data.file, data.line)}", partial))
        elif data.type == OPS:
            top = sorted(data.ops.items(), key=lambda kv: (-kv[1], kv[0]))
            names = [f"{cut(short_op(op), ITEM_MOST)} x{fmt_count(n)}" for op, n in top[:TOP_OPS]]
            if len(top) > TOP_OPS:
                names.append(f"+{len(top) - TOP_OPS} more op kinds")
            attrs.update(shape="note", style="filled" + (",dashed" if data.direction in
                                                        DASHED_PHASES else ""),
                         fillcolor=PHASE_FILL.get(data.direction, "#fafafa"),
                         label=dot_text(f"{data.direction} ops at line {data.line}", *names,
                                      _weights_text(w), partial))
        else:
            attrs.update(shape="box", style="dotted", color=HIDDEN_COLOUR,
                         fontcolor=HIDDEN_COLOUR,
                         label=dot_text(f"+{data.hidden} hidden", _weights_text(w)))
        if partial and data.type != HIDDEN:
            attrs.update(color=PARTIAL_COLOUR, penwidth="2")
        dot.node(self.ids[data.id], **attrs)

    def edge(self, dot: graphviz.Digraph, a: str, b: str, e: EdgeData) -> None:
        w = e.total
        target = self.cg.node(b)
        share = w.time_ns / self.cg.total.time_ns if self.cg.total.time_ns else 0.0
        label = fmt_count(w.ops) + (f"\\n{fmt_bytes(w.bytes)}" if w.bytes else "")
        lines = ", ".join(str(n) for n in sorted(e.lines)[:8])
        attrs = {"label": graphviz.nohtml(label), "penwidth": f"{1 + 4 * share:.1f}",
                 "tooltip": dot_text(f"{self.cg.node(a).name} -> {target.name}",
                                   f"call lines {lines}" if lines else None, _weights_text(w))}
        if target.type == COMM:
            attrs["color"] = COMM_COLOUR
        if target.type in (COMM, OPS) and target.direction in DASHED_PHASES:
            attrs["style"] = "dashed"
        if target.type == HIDDEN:
            attrs.update(style="dotted", color=HIDDEN_COLOUR)
        dot.edge(self.ids[a], self.ids[b], **attrs)


def _legend(dot: graphviz.Digraph) -> None:
    with dot.subgraph(name="cluster_legend") as leg:
        leg.attr(label="legend", fontsize="10", color="#bdbdbd", style="rounded")
        leg.attr("node", fontsize="9")
        items = [
            ("legend_fn", dict(shape="box", style="rounded,filled", fillcolor="/oranges9/3",
                               label=dot_text("function", "file:line of its def",
                                            "ops · time · bytes below it",
                                            "darker: more of the time"))),
            ("legend_ops", dict(shape="note", style="filled", fillcolor="#fafafa",
                                label=dot_text("aten ops of one call site"))),
            ("legend_comm", dict(shape="box", style="filled,bold", color=COMM_COLOUR,
                                 fillcolor=COMM_FILL, fontcolor=COMM_COLOUR,
                                 label=dot_text("collective / P2P", "bytes · time"))),
            ("legend_bwd", dict(shape="note", style="filled,dashed", fillcolor="#fafafa",
                                label=dot_text("backward (dashed): under the", "forward source "
                                             "that created it; recompute", "(lilac, dashed), "
                                             "grad_sync (green),", "optimizer (amber)"))),
            ("legend_partial", dict(shape="box", style="rounded", color=PARTIAL_COLOUR,
                                    penwidth="2", label=dot_text("reached by some ranks only"))),
            ("legend_hidden", dict(shape="box", style="dotted", color=HIDDEN_COLOUR,
                                   fontcolor=HIDDEN_COLOUR,
                                   label=dot_text("pruned below a node"))),
        ]
        for name, attrs in items:
            leg.node(name, **attrs)
        for (a, _), (b, _) in zip(items, items[1:]):
            leg.edge(a, b, style="invis")


def to_dot(cg: CallGraph, *, title: str, paths: Mapping[str, str], href: Href,
           links: Optional[Mapping[str, str]] = None) -> str:
    """DOT source of a (pruned) call graph. ``paths`` maps recorded files to display paths,
    ``href(file, line)`` gives a node's source-page URL, ``links`` optionally overrides it per
    node id (e.g. a function's zoomed subgraph page)."""
    d = _Drawer(cg, paths, href, links or {})
    summary = f"ranks {fmt_ranks(cg.ranks)} · {_weights_text(cg.total)}"
    if cg.total.flops:
        summary += f" · {fmt_flops(cg.total.flops)}FLOP"
    notes = [title, summary]
    h = cg.hidden
    if h and (h.functions or h.sites):
        pct = lambda part, whole: f"{100 * part / whole:.0f}%" if whole else "0%"  # noqa: E731
        notes.append(f"hidden for readability: {h.functions} functions, {h.sites} op sites "
                     f"({pct(h.ops, cg.total.ops)} of ops, {pct(h.time_ns, cg.total.time_ns)} "
                     f"of time, {pct(h.bytes, cg.total.bytes)} of bytes)")
    need_graphviz()
    dot = graphviz.Digraph("callgraph")
    dot.attr(label=dot_text(*notes), labelloc="t", fontsize="14", rankdir="TB", nodesep="0.25",
             ranksep="0.35", fontname="Helvetica")
    dot.attr("node", fontname="Helvetica", fontsize="10")
    dot.attr("edge", fontname="Helvetica", fontsize="9", color="#555555", arrowsize="0.6")
    for node_id in d.order:
        data = cg.node(node_id)
        link_to = data
        if data.type == HIDDEN:
            parent = next(iter(cg.graph.predecessors(node_id)), None)
            link_to = cg.node(parent) if parent else data
        d.node(dot, data, link_to)
    for a, b in sorted(cg.graph.edges(), key=lambda e: (int(d.ids[e[0]][1:]),
                                                        int(d.ids[e[1]][1:]))):
        d.edge(dot, a, b, cg.edge(a, b))
    _legend(dot)
    return dot.source


def render_svg(dot_source: str) -> str:
    """Lay out DOT with graphviz ``dot`` and return the SVG text."""
    need_graphviz()
    try:
        # quiet: dot's own stderr would be lines of its own; its first line is in the error
        return graphviz.Source(dot_source).pipe(format="svg", encoding="utf-8", quiet=True)
    except graphviz.ExecutableNotFound:
        raise RenderError("graphviz's 'dot' program was not found: install graphviz "
                          "(apt-get install graphviz)") from None
    except graphviz.CalledProcessError as exc:
        # NOTE: with an encoding given, pipe's error carries stderr as text, not bytes
        stderr = exc.stderr or ""
        if isinstance(stderr, bytes):
            stderr = stderr.decode(errors="replace")
        detail = stderr.strip().splitlines()
        raise DotFailed(f"graphviz dot failed: {detail[0] if detail else exc}") from None
