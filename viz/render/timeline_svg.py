"""Timeline SVG: one row per rank, lanes for F/B/W passes, compute and communication, and live
memory by category where it was recorded.

The measured pipeline-schedule picture: passes labelled with their micro-batch, compute and
communication as they happened on rank 0's clock, idle time shaded, step boundaries dashed, each
rank's metrics beside its row and a legend below. Written as SVG text directly (graphviz lays out
graphs, not time axes); every block has a <title> tooltip. Only draws what
viz.analysis.timeline.assemble computed.
"""
from __future__ import annotations

from typing import Optional
from xml.sax.saxutils import escape, quoteattr

import numpy as np

from ..analysis.timeline.intervals import gaps, intervals, length, union, window
from ..analysis.timeline.lanes import Timeline
from ..views.formatters import bounded_lines, fmt_bytes, fmt_time, steps_text
from ..views.memory_rows import COLOURS as MEMORY_COLOURS

COLOURS = {"F": "#4c9f70", "B": "#d1495b", "W": "#8d6cab", "compute": "#3b6ea8",
           "comm": "#f39237", "wait": "#fbd9b4", "idle": "#d0d0d0", "gpu": "#5c8fc9",
           "memory": "#2a9d8f", "path": "#111111"}
LEFT, PLOT, RIGHT = 86, 1000, 440
PASS_H, LANE_H, ROW_GAP, TOP = 20, 9, 18, 58
MEM_H = 24              # the live-memory lane, to the scale of the largest peak drawn
# Counted steps drawn: more would make every pass narrower than a pixel. The metrics beside
# each rank cover every counted step; the title says which steps are drawn.
SHOWN_STEPS = 4
MAX_PASSES = 5_000      # passes drawn one by one per rank; more are drawn merged by kind
MAX_STREAMS = 6         # GPU streams drawn per rank


def _fmt_s(seconds: Optional[float]) -> str:
    return "n/a" if seconds is None else fmt_time(seconds * 1e9)


def _pct(x: Optional[float]) -> str:
    return "n/a" if x is None else f"{100 * x:.0f}%"


class _Canvas:
    def __init__(self, lo: int, hi: int):
        self.lo, self.hi = lo, max(hi, lo + 1)
        self.parts: list = []

    def x(self, t: int) -> float:
        return LEFT + PLOT * (min(max(t, self.lo), self.hi) - self.lo) / (self.hi - self.lo)

    def rect(self, start: int, end: int, y: float, h: float, fill: str, tip: str,
             cls: str = "") -> None:
        if end <= self.lo or start >= self.hi:
            return
        x0, x1 = self.x(start), self.x(end)
        w = max(x1 - x0, 0.4)
        tip = "\n".join(bounded_lines(tip.split("\n")))
        self.parts.append(f'<rect class={quoteattr(cls)} x="{x0:.2f}" y="{y:.1f}" '
                          f'width="{w:.2f}" height="{h}" fill="{fill}"><title>{escape(tip)}'
                          f'</title></rect>')

    def label(self, start: int, end: int, y: float, h: float, text: str) -> None:
        """Centred text over a block, if the block is wide enough to hold it."""
        x0, x1 = self.x(start), self.x(end)
        if text and x1 - x0 >= 7 * len(text) + 2 and end > self.lo and start < self.hi:
            self.parts.append(f'<text x="{(x0 + x1) / 2:.2f}" y="{y + h / 2 + 4:.1f}" '
                              f'text-anchor="middle" class="mb">{escape(text)}</text>')

    def drawable(self, iv: np.ndarray) -> np.ndarray:
        """``iv`` with gaps narrower than half a pixel closed: the same picture, far fewer
        elements on long runs."""
        if len(iv) < 2:
            return iv
        half_px = (self.hi - self.lo) / PLOT / 2
        keep = np.ones(len(iv), bool)
        keep[1:] = iv[1:, 0] - iv[:-1, 1] > half_px
        first = np.nonzero(keep)[0]
        last = np.append(first[1:] - 1, len(iv) - 1)
        return np.stack([iv[first, 0], iv[last, 1]], axis=1)

    def text(self, x: float, y: float, text: str, **attrs) -> None:
        # class_ -> class (a Python keyword), text_anchor -> text-anchor
        extra = "".join(f' {k.rstrip("_").replace("_", "-")}={quoteattr(str(v))}'
                        for k, v in attrs.items())
        self.parts.append(f'<text x="{x:.1f}" y="{y:.1f}"{extra}>{escape(text)}</text>')


def _axis(c: _Canvas, y0: float, y1: float) -> None:
    span_ms = (c.hi - c.lo) / 1e6
    step = 10 ** np.floor(np.log10(max(span_ms, 1e-3) / 5))
    for mult in (1, 2, 5, 10):
        if span_ms / (step * mult) <= 10:
            step *= mult
            break
    tick = 0.0
    while tick <= span_ms + 1e-9:
        x = c.x(c.lo + int(tick * 1e6))
        c.parts.append(f'<line x1="{x:.1f}" y1="{y0}" x2="{x:.1f}" y2="{y1}" class="grid"/>')
        c.text(x, y0 - 4, f"{tick:g} ms", text_anchor="middle", class_="axis")
        tick += step


def _metrics_text(m) -> list:
    memory = getattr(m, "memory_s", 0.0)
    lines = [f"compute {_fmt_s(m.compute_s)}, comm {_fmt_s(m.comm_s)} "
             f"(exposed {_fmt_s(m.exposed_comm_s)})"
             + (f", memcpy/memset {_fmt_s(memory)}" if memory else ""),
             f"idle {_fmt_s(m.idle_s)}, overlap {_pct(m.overlap_fraction)}, "
             f"no-compute {_pct(m.bubble_fraction)} of {_fmt_s(m.wall_s)}"]
    if m.pipeline is not None:
        p = m.pipeline
        lines.append(f"pipeline bubble {_pct(p.bubble_fraction)} (theory "
                     f"{_pct(m.theoretical_bubble_fraction)}, replayed with free comm "
                     f"{_pct(p.simulated_bubble_fraction)})")
        lines.append(f"  warm-up {_pct(p.warmup_fraction)}, steady {_pct(p.steady_fraction)}, "
                     f"cool-down {_pct(p.cooldown_fraction)}")
    return lines


def render(timeline: Timeline, metrics: dict, cross=None, paths=()) -> str:
    """The SVG text of a timeline and its metrics (viz.analysis.timeline.metrics.metrics_of); with
    the cross-rank matching (viz.analysis.crossrank.matching) waiting inside a collective is drawn
    apart
    from its transfer, with the critical paths (viz.analysis.crossrank.critical_path) the path is
    drawn over each row."""
    shown = {r: [s.step for s in m.steps if s.step in m.counted_steps][:SHOWN_STEPS]
             for r, m in metrics.items()}
    windows = [timeline.ranks[r].steps[s] for r, steps in shown.items() for s in steps]
    lo = min((w[0] for w in windows), default=0)
    hi = max((w[1] for w in windows), default=1)
    c = _Canvas(lo, hi)
    ranks = sorted(timeline.ranks)
    heights = {r: _row_height(timeline.ranks[r]) for r in ranks}
    bottom = TOP + sum(h + ROW_GAP for h in heights.values())
    _axis(c, TOP - 12, bottom - ROW_GAP)
    waits = _waits(cross)
    on_path = _path_segments(paths, {s for steps in shown.values() for s in steps})
    y = TOP
    scale = max((_window_peak(timeline.ranks[r].live_memory, lo, hi) for r in ranks), default=0)
    for rank in ranks:
        _draw_rank(c, rank, timeline.ranks[rank], metrics[rank], shown[rank], y,
                   heights[rank], waits.get(rank, []), on_path.get(rank, []))
        if timeline.ranks[rank].live_memory is not None:
            _memory_lane(c, rank, timeline.ranks[rank].live_memory,
                         y + heights[rank] - MEM_H - 2, scale)
        y += heights[rank] + ROW_GAP
    kinds = {p.kind for rank in ranks for p in _shown_passes(timeline.ranks[rank], shown[rank],
                                                               lo, hi)}
    _legend(c, y + 8, any(lane.device is not None for lane in timeline.ranks.values()),
            bool(on_path), kinds, memory=scale > 0)
    title = _title(timeline, metrics)
    width = LEFT + PLOT + RIGHT
    height = bottom + 30 + (16 if scale > 0 else 0)     # the memory key's own line
    head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">'
            '<style>.grid{stroke:#eee}.step{stroke:#555;stroke-dasharray:4 3}'
            '.axis{fill:#777;font-size:9px}.lane{fill:#555;font-size:9px}.rank{font-weight:bold}'
            '.metric{fill:#333;font-size:10px}.steplabel{fill:#555;font-size:9px}'
            '.wait{opacity:0.3}.mb{fill:#111;stroke:white;stroke-width:2.5px;paint-order:stroke;'
            'font-weight:bold;pointer-events:none}</style>'
            f'<rect width="100%" height="100%" fill="white"/>'
            f'<text x="8" y="18" font-size="13" font-weight="bold">{escape(title)}</text>')
    return head + "".join(c.parts) + "</svg>\n"


def _row_height(lane) -> int:
    streams = len(_streams(lane))
    return PASS_H + 2 * LANE_H + 8 + (streams * (LANE_H + 1) + 2 if streams else 0) + \
        (MEM_H + 4 if lane.live_memory is not None else 0)


def _in_window(mem, lo: int, hi: int) -> tuple:
    """(times, live) of the corners drawn in [lo, hi): the one before ``lo`` starts it."""
    first = max(int(np.searchsorted(mem.times, lo, side="right")) - 1, 0)
    last = int(np.searchsorted(mem.times, hi, side="left"))
    return mem.times[first:last], mem.live[first:last]


def _window_peak(mem, lo: int, hi: int) -> int:
    if mem is None:
        return 0
    _, live = _in_window(mem, lo, hi)
    return int(live.sum(axis=1).max()) if len(live) else 0


def _memory_lane(c: "_Canvas", rank: int, mem, y: float, scale: int) -> None:
    """Live bytes by category, stacked (parameters at the bottom), as step functions."""
    c.text(LEFT - 4, y + MEM_H / 2 + 3, "memory", text_anchor="end", class_="lane")
    times, live = _in_window(mem, c.lo, c.hi)
    if not len(times) or scale <= 0:
        return
    xs = [max(c.x(int(t)), LEFT) for t in times] + [c.x(c.hi)]
    below = np.zeros(len(times), dtype=np.int64)
    for name, colour in MEMORY_COLOURS.items():
        if name not in mem.categories:
            continue
        mine = live[:, mem.categories.index(name)]
        if not mine.any():
            continue
        top = below + mine
        y_of = lambda b: y + MEM_H * (1 - b / scale)  # noqa: E731
        upper = [f"{xs[i]:.1f},{y_of(top[i]):.1f} {xs[i + 1]:.1f},{y_of(top[i]):.1f}"
                 for i in range(len(times))]
        lower = [f"{xs[i + 1]:.1f},{y_of(below[i]):.1f} {xs[i]:.1f},{y_of(below[i]):.1f}"
                 for i in reversed(range(len(times)))]
        c.parts.append(f'<polygon points="{" ".join(upper + lower)}" fill="{colour}" '
                       f'class="livememory"><title>rank {rank} {name.replace("_", " ")}: '
                       f'at most {escape(fmt_bytes(int(mine.max())))} live here</title>'
                       '</polygon>')
        below = top
    c.parts.append(f'<line x1="{LEFT}" y1="{y + MEM_H:.1f}" x2="{LEFT + PLOT}" '
                   f'y2="{y + MEM_H:.1f}" class="grid"/>')
    c.text(LEFT + PLOT + 10, y + MEM_H - 4,
           f"memory: peak {fmt_bytes(mem.peak_bytes)} (scale: {fmt_bytes(scale)})",
           class_="metric")


def _streams(lane) -> list:
    return sorted(set(lane.device.stream.tolist()))[:MAX_STREAMS] if lane.device else []


def _draw_rank(c: "_Canvas", rank: int, lane, m, shown: list, y: float, row_h: int,
               waits: list, on_path: list) -> None:
    """One rank's row: passes, compute, communication (waits apart), GPU streams, the path."""
    lo, hi = c.lo, c.hi
    c.text(8, y + PASS_H / 2 + 4, f"rank {rank}", class_="rank")
    c.text(LEFT - 4, y + PASS_H + LANE_H - 1, "compute", text_anchor="end", class_="lane")
    c.text(LEFT - 4, y + PASS_H + 2 * LANE_H + 1, "comm", text_anchor="end", class_="lane")
    busy = union(np.concatenate([window(lane.compute, lo, hi), window(lane.comm_union, lo, hi),
                                 window(lane.memory, lo, hi)]))
    for s in shown:
        a, b = lane.steps[s]
        for g0, g1 in c.drawable(gaps(busy, a, b)).tolist():
            c.rect(g0, g1, y + PASS_H + 2, 2 * LANE_H, COLOURS["idle"],
                   f"rank {rank} idle {_fmt_s((g1 - g0) / 1e9)}", cls="idle")
    _passes(c, lane, rank, _shown_passes(lane, shown, lo, hi), y)
    shown_compute = window(lane.compute, lo, hi)
    for a, b in c.drawable(shown_compute).tolist():
        c.rect(a, b, y + PASS_H + 2, LANE_H, COLOURS["compute"],
               f"rank {rank} computing {_fmt_s(length(window(shown_compute, a, b)) / 1e9)}"
               f" in {_fmt_s((b - a) / 1e9)}", cls="compute")
    for a, b in c.drawable(window(lane.memory, lo, hi)).tolist():
        c.rect(a, b, y + PASS_H + 2, LANE_H, COLOURS["memory"],
               f"rank {rank} copying or setting memory (memcpy, memset) "
               f"{_fmt_s((b - a) / 1e9)}", cls="memory")
    _comm_blocks(c, lane, rank, y + PASS_H + 2 + LANE_H + 1, lo, hi)
    for a, b, last in waits:
        c.rect(a, b, y + PASS_H + 2 + LANE_H + 1, LANE_H, COLOURS["wait"],
               f"rank {rank} waiting {_fmt_s((b - a) / 1e9)} for rank {last} to arrive",
               cls="commwait")
    _gpu_lanes(c, lane, rank, y + PASS_H + 2 * LANE_H + 6)
    for a, b, what in on_path:
        c.rect(a, b, y - 4, 3, COLOURS["path"], f"critical path: {what} on rank {rank} "
               f"{_fmt_s((b - a) / 1e9)}", cls="path")
    for s in shown:
        x = c.x(lane.steps[s][0])
        c.parts.append(f'<line x1="{x:.1f}" y1="{y - 3}" x2="{x:.1f}" y2="{y + row_h}" '
                       f'class="step"><title>step {s} starts</title></line>')
        c.text(x + 2, y - 3, f"step {s}", class_="steplabel")
    for i, line in enumerate(_metrics_text(m) + ([f"clock: {lane.clock}"]
                                                  if lane.clock != "host" else [])):
        c.text(LEFT + PLOT + 10, y + 10 + 12 * i, line, class_="metric")


def _shown_passes(lane, shown: list, lo: int, hi: int) -> list:
    """The rank's passes of the steps drawn, inside the picture's time range."""
    return [p for p in lane.passes if p.step in shown and p.end > lo and p.start < hi]


def _passes(c: "_Canvas", lane, rank: int, passes: list, y: float) -> None:
    if len(passes) > MAX_PASSES:           # too many to tell apart: one band per kind
        _merged_passes(c, passes, rank, y)
        return
    for p in passes:
        label = "" if p.microbatch is None else str(p.microbatch)
        if p.chunk:
            label += f".{p.chunk}"
        tip = (f"rank {rank} {p.kind} micro-batch {p.microbatch} chunk {p.chunk} step "
               f"{p.step}: {_fmt_s((p.end - p.start) / 1e9)} ({p.source})")
        # The whole pass pale, the stretches it computed in full colour: waits inside a
        # pass (its input's recv) stay visible.
        c.rect(p.start, p.end, y, PASS_H, COLOURS[p.kind], tip, cls=f"pass wait {p.kind}")
        for a, b in c.drawable(window(lane.compute, p.start, p.end)).tolist():
            c.rect(a, b, y, PASS_H, COLOURS[p.kind], tip, cls=f"pass {p.kind}")
        c.label(p.start, p.end, y, PASS_H, label)


def _gpu_lanes(c: "_Canvas", lane, rank: int, y: float) -> None:
    """A lane per CUDA stream: kernels, memory activity (memcpy, memset) and communication
    (NCCL's kernels and the copies of collectives), each in its colour."""
    for i, stream in enumerate(_streams(lane)):
        dev = lane.device
        row = y + i * (LANE_H + 1)
        c.text(LEFT - 4, row + LANE_H - 1, f"GPU {stream}", text_anchor="end", class_="lane")
        memory = dev.memory if dev.memory is not None else np.zeros(len(dev.start), bool)
        on = dev.stream == stream
        for sel, colour, what in ((on & ~dev.comm & ~memory, COLOURS["gpu"], "kernels"),
                                  (on & memory, COLOURS["memory"], "memcpy/memset"),
                                  (on & dev.comm, COLOURS["comm"], "NCCL")):
            for a, b in c.drawable(union(intervals(dev.start[sel], dev.end[sel]))).tolist():
                c.rect(a, b, row, LANE_H, colour, f"rank {rank} stream {stream}: "
                       f"{what} {_fmt_s((b - a) / 1e9)}", cls="gpu")


def _waits(cross) -> dict:
    """rank -> (launch, last arrival, last rank) of each matched collective it waited in."""
    out: dict = {}
    for m in getattr(cross, "matched", ()):
        for rank, span in m.spans.items():
            if rank != m.last_rank and m.last_arrival > span.start:
                out.setdefault(rank, []).append((span.start, m.last_arrival, m.last_rank))
    return out


def _path_segments(paths, steps: set) -> dict:
    out: dict = {}
    for p in paths:
        if p.step in steps:
            for s in p.segments:
                out.setdefault(s.rank, []).append((s.start, s.end, s.what))
    return out


def _merged_passes(c: "_Canvas", passes: list, rank: int, y: float) -> None:
    for kind in sorted({p.kind for p in passes}):
        mine = [p for p in passes if p.kind == kind]
        for a, b in c.drawable(union(intervals([p.start for p in mine],
                                               [p.end for p in mine]))).tolist():
            c.rect(a, b, y, PASS_H, COLOURS[kind],
                   f"rank {rank} {kind} passes ({len(mine)} in the steps drawn, merged)",
                   cls=f"pass {kind}")


def _comm_blocks(c: _Canvas, lane, rank: int, y: float, lo: int, hi: int) -> None:
    """One block per merged stretch of communication, its tooltip listing what ran in it."""
    starts = lane.comm.column("start")
    for a, b in c.drawable(window(lane.comm_union, lo, hi)).tolist():
        # every span lies inside one stretch of the union: find them by their starts
        inside = [x for x in lane.comm[np.searchsorted(starts, a):np.searchsorted(starts, b)]
                  if x.on_gpu is not False]
        kinds: dict = {}
        for x in inside:
            kinds[x.kind] = kinds.get(x.kind, 0) + 1
        what = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
        nbytes = sum(x.nbytes for x in inside)
        c.rect(a, b, y, LANE_H, COLOURS["comm"],
               f"rank {rank} communicating {_fmt_s((b - a) / 1e9)}: {what}, {nbytes} bytes",
               cls="comm")


PASS_KEYS = (("F", "forward pass (micro-batch)"), ("B", "backward pass"),
             ("W", "weight-gradient pass"))


def _legend(c: "_Canvas", y: float, gpu: bool, path: bool, kinds: set,
            memory: bool = False) -> None:
    """The colours' key: the pass kinds drawn (none without passes), then the lanes'; the
    memory categories on a line of their own."""
    x = LEFT
    keys = [key for key in PASS_KEYS if key[0] in kinds] + [("compute", "computing"),
            ("comm", "communication in flight"), ("wait", "waiting for a late rank"),
            ("idle", "idle")] + ([("gpu", "GPU kernels"), ("memory", "memcpy/memset")]
                                 if gpu else []) + \
        ([("path", "critical path")] if path else [])
    for key, text in keys:
        c.parts.append(f'<rect x="{x}" y="{y}" width="12" height="10" fill="{COLOURS[key]}"/>')
        c.text(x + 16, y + 9, text)
        x += 30 + 6.2 * len(text)
    c.parts.append(f'<line x1="{x}" y1="{y - 2}" x2="{x}" y2="{y + 12}" class="step"/>')
    c.text(x + 6, y + 9, "step boundary")
    if memory:
        x = LEFT
        for name, colour in MEMORY_COLOURS.items():
            text = "live " + name.replace("_", " ")
            c.parts.append(f'<rect x="{x}" y="{y + 16}" width="12" height="10" '
                           f'fill="{colour}"/>')
            c.text(x + 16, y + 25, text)
            x += 30 + 6.2 * len(text)


def _title(timeline: Timeline, metrics: dict) -> str:
    cfg = timeline.config
    parts = [f"{k} {cfg[k]}" for k in ("tp", "pp", "dp", "schedule", "microbatches",
                                       "virtual_stages") if cfg.get(k) not in (None, "")]
    steps = sorted({s for m in metrics.values() for s in m.counted_steps})
    drawn = steps[:SHOWN_STEPS]
    shown = steps_text(drawn)
    if len(drawn) < len(steps):
        shown += f" of {len(steps)} counted (metrics cover all)"
    return "Timeline" + (f" ({', '.join(parts)})" if parts else "") + f", {shown}"
