"""The offline HTML report of a run: what users open after a run.

``build_report(run, out_dir)`` writes into ``out_dir``::

    index.html                 the run, problems first (hung / failed / missing ranks), a table
                               of ranks, links to everything below
    callgraphs/all.html        call graph of all ranks merged (+ all.svg)
    callgraphs/rank-R.html     call graph of one rank (+ rank-R.svg)
    callgraphs/fn-N.html       a function zoomed in (every path starting there)
    callgraphs/mod-N.html      the ops of one nn.Module subtree
    modules.html               the nn.Module tree: ops, FLOPs, time, communication
    ranks/rank-R.html          one rank: status, error, metadata, ops, collectives, modules
    source/<file>.html         a source file, each line with the ops and collectives it issued

and links ``summary.json`` (written before by viz.summary, when present) and the timeline
(written by viz.timeline.write_timeline). Analyses come from viz.callgraph / viz.modules; this
module only arranges them into pages. No page loads anything from the network.
"""
from __future__ import annotations

import json
import os
import re
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Optional

import numpy as np

from tracer import rundir

from .callgraph import (FUNCTION, HIDDEN, NO_STACK, CallGraph, Weights, build_callgraph, importance,
                        prune, run_groups, source_lines, total_of, trim_common_prefix)
from .modules import NO_MODULE, module_tree
from .render import fmt_bytes, fmt_count, fmt_time
from .render.callgraph_svg import render_svg, to_dot
from .render.html import PageWriter
from .source import display_paths, read_source
from .timeline import write_timeline
from .trace import Run


WHOLE_GRAPH = 0.9   # a function holding this share of every measure is nearly the whole graph


@dataclass(frozen=True)
class ReportOptions:
    """How much the report draws."""

    max_nodes: int = 150         # per SVG, notes of hidden nodes included
    min_share: float = 0.005     # nodes below this share of ops, time and bytes are hidden
    zoom_functions: int = 24     # functions that get their own zoomed call graph
    zoom_modules: int = 16       # modules that get their own call graph
    zoom_min_share: float = 0.02  # ... if they account for at least this share


@dataclass
class GraphPage:
    """One call-graph page to draw."""

    rel: str                  # callgraphs/<name>.html
    title: str
    graph: CallGraph
    note: str = ""
    svg: str = ""


@dataclass
class LineView:
    """A source line with what it issued, as text for the source page."""

    number: int
    text: str
    direct: list = field(default_factory=list)
    comm: list = field(default_factory=list)
    through: list = field(default_factory=list)


def build_report(run: Run, out_dir: str, *, options: ReportOptions = ReportOptions()) -> str:
    """Write index.html and every page it links into ``out_dir``; return index.html's path."""
    os.makedirs(out_dir, exist_ok=True)
    pages = PageWriter(out_dir)
    world = tuple(range(run.world_size))
    groups = run_groups(run)
    merged = [g for rank in sorted(groups) for g in groups[rank]]

    files = {f.file for g in merged for f in g.path}
    files |= {g.boundary.file for g in merged if g.boundary}
    paths = display_paths(files)
    source_pages = _slugs({f.file for g in merged for f in g.path if f is not NO_STACK})

    def href_from(depth: int):
        up = "../" * depth
        return lambda file, line: (f"{up}{source_pages[file]}#L{line}"
                                   if file in source_pages else None)

    full = build_callgraph(merged, world=world)
    graphs = [GraphPage("callgraphs/all.html", "Call graph: all ranks merged",
                        prune(full, max_nodes=options.max_nodes, min_share=options.min_share),
                        "Ops and time are summed over ranks; a purple node is reached by some "
                        "ranks only.")]
    for rank in sorted(groups):
        g = build_callgraph(groups[rank], world=world)
        graphs.append(GraphPage(f"callgraphs/rank-{rank}.html", f"Call graph: rank {rank}",
                                prune(g, max_nodes=options.max_nodes,
                                      min_share=options.min_share)))
    zooms = _function_zooms(full, graphs[0].graph, merged, world, options)
    graphs += zooms.values()
    tree = module_tree(merged)
    module_zooms = _module_zooms(tree, merged, world, options)
    graphs += module_zooms.values()

    with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as pool:
        sources = [to_dot(p.graph, title=p.title, paths=paths, href=href_from(1))
                   for p in graphs]
        for page, svg in zip(graphs, pool.map(render_svg, sources)):
            page.svg = svg
    zoom_links = {fid: os.path.basename(p.rel) for fid, p in zooms.items()}
    for page in graphs:
        name = os.path.splitext(os.path.basename(page.rel))[0]
        pages.write_text(f"callgraphs/{name}.svg", page.svg)
        zoom_rows = [dict(name=full.node(fid).name, where=paths.get(full.node(fid).file, ""),
                          href=zoom_links[fid], w=full.node(fid).total)
                     for fid in zooms if fid in page.graph.graph and
                     zooms[fid].rel != page.rel]
        pages.write(page.rel, "callgraph.html", title=page.title, note=page.note,
                    svg=_inline_svg(page.svg), svg_file=f"{name}.svg", zooms=zoom_rows,
                    graph=page.graph)

    module_links = {path: f"callgraphs/{os.path.basename(p.rel)}"
                    for path, p in module_zooms.items()}
    pages.write("modules.html", "modules.html", title="Module view", rows=tree,
                links=module_links, world=world)

    lines = source_lines(merged)
    defined = defaultdict(list)
    for data in full.nodes(FUNCTION):
        defined[data.file].append(dict(name=data.name, line=data.line,
                                       zoom=zoom_links.get(data.id), w=data.total))
    started = min((t.meta.get("start_unix") or 0) for t in run.ranks.values())
    for file, rel in source_pages.items():
        text = read_source(file)
        pages.write(rel, "source.html", title=paths.get(file, file), recorded_path=file,
                    available=text is not None, stale=_changed_since(file, started),
                    lines=_line_views(text, lines.get(file, {})),
                    functions=sorted(defined.get(file, []), key=lambda d: d["line"]))

    summary = _read_summary(out_dir)
    rank_rows = _rank_rows(run, groups, summary)
    for row in rank_rows:
        if row["rank"] in groups:
            trace = run.ranks[row["rank"]]
            pages.write(f"ranks/rank-{row['rank']}.html", "rank.html",
                        title=f"Rank {row['rank']}", row=row, meta=_meta_rows(trace.meta),
                        warnings=trace.warnings, ops=_op_counts(groups[row["rank"]]),
                        comm=_comm_rows(groups[row["rank"]]),
                        modules=module_tree(groups[row["rank"]]), world=world)

    index = pages.write("index.html", "index.html", title="paratrace report",
                        problems=_problems(run), run=_run_facts(run), ranks=rank_rows,
                        graphs=graphs[:1 + len(groups)], zooms=list(zooms.values()),
                        module_zooms=list(module_zooms.values()),
                        sources=sorted((paths.get(f, f), rel) for f, rel in source_pages.items()),
                        summary_json=rundir.SUMMARY if summary is not None else None,
                        timeline=dict(write_timeline(run, out_dir)))
    return index


# ---------------------------------------------------------------------------- graph pages
def _function_zooms(full: CallGraph, shown: CallGraph, merged: list, world: tuple,
                    options: ReportOptions) -> dict:
    """Function node id -> page of that function zoomed in. Worth it only for functions under
    which the merged graph (``shown``, pruned) hid something, and that are not nearly the whole
    graph already; the biggest first."""
    candidates = [full.node(n) for n in shown.graph
                  if shown.node(n).type == FUNCTION
                  and any(shown.node(c).type == HIDDEN for c in shown.graph.successors(n))
                  and options.zoom_min_share <= importance(full, full.node(n)) < WHOLE_GRAPH]
    candidates.sort(key=lambda d: (-importance(full, d), d.id))
    chosen = candidates[:options.zoom_functions]
    # Each zoom only needs the groups whose path runs through its function.
    keys = {(d.file, d.name) for d in chosen}
    through = defaultdict(list)
    for grp in merged:
        for key in {(f.file, f.qualname) for f in grp.path} & keys:
            through[key].append(grp)
    out = {}
    for i, data in enumerate(chosen):
        key = (data.file, data.name)
        g = build_callgraph(through[key], world=world, root=key)
        out[data.id] = GraphPage(f"callgraphs/fn-{i}.html", f"Zoom: {data.name}",
                                 prune(g, max_nodes=options.max_nodes,
                                       min_share=options.min_share),
                                 "Every path through this function, starting at it; shares "
                                 "are of what it issued.")
    return out


def _module_zooms(tree: list, merged: list, world: tuple, options: ReportOptions) -> dict:
    """Module path -> page of the call graph of that module subtree's ops."""
    total = total_of(r.total for r in tree if r.depth == 0)
    rows = [r for r in tree if r.path != NO_MODULE and r.depth <= 3 and total.ops
            and r.total.ops / total.ops >= options.zoom_min_share]
    rows.sort(key=lambda r: (r.depth, -r.total.ops, r.path))
    out = {}
    for i, row in enumerate(rows[:options.zoom_modules]):
        prefix = row.path + "."
        mine = [g for g in merged if g.module and (g.module == row.path
                                                    or g.module.startswith(prefix))]
        g = build_callgraph(trim_common_prefix(mine), world=world)
        out[row.path] = GraphPage(f"callgraphs/mod-{i}.html", f"Module {row.path}",
                                  prune(g, max_nodes=options.max_nodes,
                                        min_share=options.min_share),
                                  "Ops issued inside this module and its submodules (backward "
                                  "ops by the module that created them).")
    return out


def _changed_since(file: str, unix_time: float) -> bool:
    """Whether a source file was modified after the run started (its lines may have moved)."""
    try:
        return bool(unix_time) and os.path.getmtime(file) > unix_time
    except OSError:
        return False


def _inline_svg(svg: str) -> str:
    """dot's SVG without its XML prolog and DOCTYPE, to embed in an HTML page."""
    start = svg.find("<svg")
    return svg[start:] if start >= 0 else svg


def _slugs(files) -> dict:
    """Recorded file -> its source page path, unique and filesystem-safe."""
    out, used = {}, set()
    names = display_paths(files)
    for file in sorted(names):
        base = re.sub(r"[^A-Za-z0-9_.-]", "_", names[file].replace("/", "__")) or "file"
        slug, n = base, 1
        while slug in used:
            n += 1
            slug = f"{base}-{n}"
        used.add(slug)
        out[file] = f"source/{slug}.html"
    return out


# ---------------------------------------------------------------------------- source pages
def _summarise(entries: dict, key_text) -> list:
    """Line annotations: one text per (what, direction), biggest first."""
    items = sorted(entries.items(), key=lambda kv: (-kv[1].ops, str(kv[0])))
    return [key_text(key, w) for key, w in items]


def _short_op(op: str) -> str:
    parts = op.split(".")
    return parts[1] if len(parts) >= 2 else op


def _line_views(text: Optional[list], per_line: dict) -> list:
    """Every line of a readable file, or only the lines that issued ops when it is not."""
    numbers = range(1, len(text) + 1) if text is not None else sorted(per_line)
    out = []
    for n in numbers:
        ops = per_line.get(n)
        view = LineView(n, text[n - 1] if text is not None and n <= len(text) else "")
        if ops is not None:
            view.direct = _summarise(ops.direct, lambda k, w: (
                f"{k[1]}: {_short_op(k[0])} x{fmt_count(w.ops)} · {fmt_time(w.time_ns)}"))
            view.comm = _summarise(ops.comm, lambda k, w: (
                f"{k[1]}: {k[0]} x{fmt_count(w.comms)} · {fmt_bytes(w.bytes)} · "
                f"{fmt_time(w.time_ns)}"))
            view.through = _summarise(ops.through, lambda k, w: (
                f"{k}: {fmt_count(w.ops)} ops in the functions it calls · "
                f"{fmt_time(w.time_ns)}"))
        out.append(view)
    return out


# ---------------------------------------------------------------------------- run and ranks
def _read_summary(out_dir: str) -> Optional[dict]:
    path = os.path.join(out_dir, rundir.SUMMARY)
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def _rank_rows(run: Run, groups: dict, summary: Optional[dict]) -> list:
    rows = []
    for rank in range(run.world_size):
        row = dict(rank=rank, status=run.status(rank), error=run.error(rank), host="",
                   events=0, w=Weights(), compute=Weights(), comm=Weights(), time={})
        if rank in run.ranks:
            trace = run.ranks[rank]
            row["host"] = trace.meta.get("host", "")
            row["events"] = len(trace)
            row["w"] = total_of(g.weights() for g in groups[rank])
            row["compute"] = total_of(g.weights() for g in groups[rank] if not g.kind)
            row["comm"] = total_of(g.weights() for g in groups[rank] if g.kind)
        if summary:
            row["time"] = _time_texts(
                ((summary.get("ranks") or {}).get(str(rank)) or {}).get("time") or {})
        rows.append(row)
    return rows


def _time_texts(time: dict) -> dict:
    """summary.json's time metrics of a rank, formatted (seconds and fractions)."""
    def seconds(key):
        value = time.get(key)
        return fmt_time(value * 1e9) if isinstance(value, (int, float)) else ""

    def percent(key):
        value = time.get(key)
        return f"{100 * value:.1f} %" if isinstance(value, (int, float)) else ""
    return dict(wall=seconds("wall_s"), exposed_comm=seconds("exposed_comm_s"),
                bubble=percent("bubble_fraction"))


def _op_counts(groups: list) -> list:
    counts = defaultdict(Weights)
    for g in groups:
        counts[(g.op, g.phase)].add(g.weights())
    return sorted(counts.items(), key=lambda kv: (-kv[1].ops, kv[0]))


def _comm_rows(groups: list) -> list:
    rows = defaultdict(Weights)
    for g in groups:
        if g.kind:
            rows[(g.kind, g.phase)].add(g.weights())
    return sorted(rows.items())


_META_KEYS = ("host", "pid", "local_rank", "node_rank", "backend", "torch", "python", "status",
              "error", "last_step", "last_collective", "inflight")


def _meta_rows(meta: dict) -> list:
    rows = [(k, meta.get(k)) for k in _META_KEYS if meta.get(k) not in (None, "", [], {})]
    for key in ("clock_start", "clock_end"):
        clock = meta.get(key)
        if clock:
            rows.append((key, f"offset {fmt_time(abs(clock.get('offset_ns', 0)))} "
                              f"{'ahead' if clock.get('offset_ns', 0) < 0 else 'behind'}, error "
                              f"<= {fmt_time(clock.get('error_ns', 0))} ({clock.get('method')})"))
    if meta.get("start_unix"):
        rows.append(("started", _utc(meta["start_unix"])))
    return rows


def _utc(ts: float) -> str:
    return datetime.fromtimestamp(float(ts), timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _problems(run: Run) -> list:
    """What went wrong, most important first: a hang (who never arrived), failed ranks, ranks
    without a trace, truncated traces."""
    out = []
    hang = run.info.get("hang")
    if hang:
        never = hang.get("never_arrived") or []
        details = []
        for rank, info in sorted((hang.get("ranks") or {}).items(), key=lambda kv: int(kv[0])):
            details.append(dict(rank=rank, status=info.get("status"), step=info.get("step"),
                                last=info.get("last_collective"),
                                inflight=info.get("inflight"), stack=info.get("stack")))
        out.append(dict(level="hang", title=(
            f"Hang: rank{'s' if len(never) != 1 else ''} "
            f"{', '.join(str(r) for r in never) or '?'} never arrived"
            + (f" (watchdog timeout {hang.get('timeout_s')} s)" if hang.get("timeout_s") else "")),
            details=details))
    for rank in range(run.world_size):
        status = run.status(rank)
        if status == "failed":
            out.append(dict(level="failed", title=f"rank {rank} failed: "
                                                  f"{run.error(rank) or 'no error recorded'}",
                            details=[]))
        elif status == "missing":
            out.append(dict(level="missing", title=f"rank {rank}: no trace"
                            + (f" ({run.problems[rank]})" if rank in run.problems else ""),
                            details=[]))
    for rank, trace in sorted(run.ranks.items()):
        for warning in trace.warnings:
            out.append(dict(level="warning", title=f"rank {rank}: {warning}", details=[]))
    return out


def _run_facts(run: Run) -> dict:
    first = run.ranks[min(run.ranks)]
    command = run.info.get("command")
    if isinstance(command, list):
        command = " ".join(str(c) for c in command)
    steps: set = set()
    for trace in run.ranks.values():
        steps.update(int(s) for s in np.unique(trace.col("step")))
    return dict(command=command or " ".join(first.meta.get("argv") or []),
                exit_code=run.info.get("exit_code"), world_size=run.world_size,
                config=run.config, steps=steps, backend=first.meta.get("backend"),
                torch=first.meta.get("torch"), dir=run.dir,
                started=_utc(first.meta["start_unix"]) if first.meta.get("start_unix") else "")
