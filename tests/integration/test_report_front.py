"""The report's front page and call graphs as a person sees them, in real headless Chromium.

On the session's two-step run (conftest.two_step_run): the front page leads with the timeline
picture and a line per rank carrying summary.json's numbers, and its top ops and collectives
equal a count made straight from the trace columns, each linked to a highlighted source line;
the call graphs show the counted step and the setup graph the rest, adding up to the whole
recording; every new page loads without a console message, renders something, and every link
resolves; names from a trace full of HTML stay text on the front page, in the graphs and in the
search list.
"""
from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from support.browser import Browser, blank
from support.html_links import check_links, parse
from viz.cli import build


@pytest.fixture(scope="module")
def report(two_step_run) -> Path:
    return two_step_run


def rows_of(browser: Browser, selector: str) -> list:
    """The text of every data row of the first table matching ``selector``."""
    return browser.js(f"Array.from(document.querySelector({json.dumps(selector)}).rows)"
                      ".slice(1).map(tr => Array.from(tr.cells).map(c => c.textContent.trim()))")


def counted_steps(summary: dict) -> set:
    return {s for r in summary["ranks"].values() for s in r["time"]["counted_steps"]}


def top_by_time(run_dir: str, steps: set, comm: bool) -> list:
    """Ops (or collectives by kind and phase) by summed duration over ``steps``, all ranks,
    straight from the trace columns: what the front page's tables must say. A send ends no
    later than the receive that took its data (docs/metrics.md): the k-th send from a to b in a
    group pairs with the k-th receive on b from a, on the aligned clock."""
    from tracer import load
    from tracer.vocab.labels import PHASES
    from tracer.vocab.ops import PSEUDO_OPS
    traces = {int(p.stem.split("-")[1]): load(str(p))
              for p in Path(run_dir, "traces").glob("rank-*.arrow")}
    ends, queues = {}, {}                 # (rank, row) -> aligned end; pairing queues
    for rank, t in sorted(traces.items()):
        kinds, groups = t.dictionary("kind"), t.dictionary("group")
        g0, g1 = t.global_times()
        for i, (kind, group, peer) in enumerate(zip(t.col("kind").tolist(),
                                                    t.col("group").tolist(),
                                                    t.col("peer").tolist())):
            if kind >= 0 and kinds[kind] in ("send", "recv"):
                is_recv = kinds[kind] == "recv"
                pair = (groups[group], peer, rank) if is_recv else (groups[group], rank, peer)
                queues.setdefault(pair, ([], []))[is_recv].append((rank, i, int(g1[i])))
    for sends, recvs in queues.values():
        for (rank, i, _), (_, _, recv_end) in zip(sends, recvs):
            ends[(rank, i)] = recv_end
    totals: Counter = Counter()
    calls: Counter = Counter()
    for rank, t in sorted(traces.items()):
        ops, kinds = t.dictionary("op"), t.dictionary("kind")
        g0, g1 = t.global_times()
        ret = t.col("t_ret") + t.clock_offset(np.maximum(t.col("t_ret"), 0))
        for i, (op, kind, phase, step, t0, t1) in enumerate(zip(
                t.col("op").tolist(), t.col("kind").tolist(), t.col("phase").tolist(),
                t.col("step").tolist(), t.col("t0").tolist(), t.col("t1").tolist())):
            if step not in steps or ops[op] in PSEUDO_OPS or (kind >= 0) != comm:
                continue
            key = f"{kinds[kind]} ({PHASES[phase]})" if comm else ops[op]
            ns = max(t1 - t0, 0) if t1 >= 0 else 0
            limit = ends.get((rank, i))
            if limit is not None and t1 >= 0 and 0 <= limit < g1[i]:
                ns = int(max(limit, max(ret[i], g0[i]))) - int(g0[i])
            totals[key] += ns
            calls[key] += 1
    return [(key, calls[key], ns) for key, ns in totals.most_common(5)]


def test_front_page_answers_what_happened(report, browser, tmp_path):
    from viz.views.formatters import fmt_count, fmt_time, short_op
    summary = json.loads((report / "summary.json").read_text())
    steps = counted_steps(summary)
    assert steps == {1}, steps              # step 0 (setup) and the unfinished tail left out
    browser.console.clear()
    browser.open((report / "index.html").as_uri())
    assert browser.console == [], browser.console
    assert not blank(browser.screenshot(tmp_path / "index.png"))
    # the timeline picture comes first, inline, linked to its own page
    first = browser.js("[...document.querySelectorAll('main h2')].map(h => h.id)")
    assert first[:2] == ["timeline", "steps"], first
    assert browser.js("document.querySelector('main a.preview').getAttribute('href')") == \
        "timeline.html"
    texts = browser.js("[...document.querySelectorAll('a.preview svg text')]"
                       ".map(t => t.textContent)")
    assert [f"rank {r}" for r in range(4)] == [t for t in texts if t.startswith("rank ")]
    assert browser.js("document.querySelector('a.preview svg').getBoundingClientRect().width")\
        > 900                                           # drawn across the page, not a thumbnail
    # one line per rank with summary.json's numbers, per counted step, the time per phase
    # beside the step (an annotated run: the phases its ops carry)
    rows = rows_of(browser, "table.headline")
    headings = browser.js("[...document.querySelectorAll('table.headline th')]"
                          ".map(th => th.textContent.trim())")
    col = {h: i for i, h in enumerate(headings)}
    phases = headings[3:col["where the step went"]]
    assert headings[:3] == ["rank", "status", "step time"]
    assert phases[:2] == ["forward", "backward"] and "optimizer" in phases, headings
    assert [r[0] for r in rows] == ["0", "1", "2", "3"]
    for row in rows:
        time = summary["ranks"][row[0]]["time"]
        n = len(time["counted_steps"])
        assert row[1] == "ok"
        assert row[2] == fmt_time(time["wall_s"] / n * 1e9)
        for phase in phases:
            seconds = time["phase_s"][phase]
            assert row[col[phase]] == (fmt_time(seconds / n * 1e9) if seconds else "")
        assert row[col["compute"]] == fmt_time(time["compute_s"] / n * 1e9)
        assert row[col["exposed comm"]] == fmt_time(time["exposed_comm_s"] / n * 1e9)
        assert row[col["overlap"]] == f"{100 * time['overlap_fraction']:.0f} %"
        assert row[col["bubble (theory)"]] == (
            f"{100 * time['pipeline']['bubble_fraction']:.0f} % "
            f"({100 * time['theoretical_bubble_fraction']:.0f} %)")
        assert row[col["clock"]] == "host"
    # the legend keys the passes drawn: F and B (1F1B has no W pass)
    legend = browser.js("[...document.querySelectorAll('a.preview svg > text')]"
                        ".map(t => t.textContent)")
    assert {"forward pass (micro-batch)", "backward pass"} <= set(legend), legend
    assert "weight-gradient pass" not in legend
    # the step's bars (the memory table's, memory being recorded by default, are to the
    # scale of the largest peak)
    bars = browser.js("[...document.querySelectorAll('table.headline:not(.memory) .bar')]"
                      ".map(b => [...b.children]"
                      ".reduce((s, c) => s + c.getBoundingClientRect().width, 0)"
                      " / b.getBoundingClientRect().width)")
    assert len(bars) == 4 and all(0.98 < b < 1.02 for b in bars), bars
    # the top ops and collectives, as the traces' own columns count them
    for index, comm in ((1, False), (2, True)):
        shown = rows_of(browser, f".tops section:nth-child({index}) table")
        want = top_by_time(str(report), steps, comm)
        assert [r[0] for r in shown] == [k if comm else short_op(k) for k, _, _ in want]
        assert [r[1] for r in shown] == [fmt_count(n) for _, n, _ in want]
        assert [r[3 if comm else 2] for r in shown] == [fmt_time(ns) for _, _, ns in want]
    # each with a link to the source line that issued most of its time
    links = browser.js("[...document.querySelectorAll('.tops td a')].map(a => "
                       "a.getAttribute('href'))")
    assert len(links) == 10, links
    for link in links:
        page, line = link.split("#")
        html = (report / page).read_text()
        assert re.search(rf'<tr id="{line}" class="hot">', html), link


# every cell of the top-ops and top-collectives tables is what a click at its centre hits
# (the two tables side by side once overlapped: a long op name pushed one under the other)
_CELLS_HIT = """(() => { const bad = [];
  for (const s of document.querySelectorAll('.tops > section')) {
    const sr = s.getBoundingClientRect();
    for (const td of s.querySelectorAll('td')) {
      td.scrollIntoView({block: 'center'});
      const r = td.getBoundingClientRect(), x = r.left + r.width / 2, y = r.top + r.height / 2;
      if (x > sr.right && getComputedStyle(s).overflowX !== 'visible') continue;  // scrolls
      const hit = document.elementFromPoint(x, y);
      if (!hit || !td.contains(hit)) bad.push(td.textContent.trim().slice(0, 40));
    }
  }
  return bad; })()"""


@pytest.fixture(scope="module")
def long_names(tmp_path_factory) -> Path:
    """A report whose top ops and collectives carry long op names and source lines (a CPU
    flash-attention backward, a deep site-packages path, long qualnames)."""
    from support.constructed.synthetic import SyntheticRank
    root = tmp_path_factory.mktemp("long-names")
    site = [("/opt/venvs/project/lib/python3.11/site-packages/megatron/core/transformer/"
             "dot_product_attention_with_a_long_module_name.py", 1234, "forward",
             "DotProductAttentionWithALongName.forward_with_an_even_longer_qualname")]
    names = ["aten._scaled_dot_product_flash_attention_for_cpu_backward.default",
             "aten._efficient_attention_forward_with_a_long_overload.default", "aten.mm.default",
             "aten.native_layer_norm_backward.default", "aten.embedding_dense_backward.default"]
    for rank in range(2):
        r = SyntheticRank(rank, 2)
        for step in range(3):
            base = 1000 * step
            for i, name in enumerate(names):
                r.op(base + 10 * i, base + 10 * i + 9 - i, name=name, stack=site)
            for i, kind in enumerate(("all_reduce", "all_gather", "reduce_scatter")):
                r.comm(kind, base + 100 + 20 * i, base + 101 + 20 * i, base + 115 + 20 * i,
                       group=(0, 1), stack=site)
            r.next_step(base + 500)
        r.write(root / "run" / "traces")
    return Path(build(str(root / "run"), str(root / "out"))[0])


@pytest.mark.parametrize("width", [1400, 1920])
def test_the_top_tables_do_not_overlap_side_by_side(long_names, browser, width):
    browser.call("Emulation.setDeviceMetricsOverride", {
        "width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False})
    try:
        browser.open(long_names.as_uri())
        tops = browser.js("[...document.querySelectorAll('.tops > section')]"
                          ".map(s => s.getBoundingClientRect().top)")
        assert len(tops) == 2 and tops[0] == tops[1]          # side by side at this width
        assert browser.js(_CELLS_HIT) == []
        # names wrap at '.', '_', '/' and ':' rather than scroll, and not letter by letter (a
        # name broken anywhere made a first row 38 lines tall at 1400 px)
        # (each table scrolls in its own box: base.html)
        fit = browser.js("[...document.querySelectorAll('.tops > section > table')].map(s => ["
                         "s.scrollWidth - s.clientWidth, Math.max(...[...s.querySelectorAll('tr')]"
                         ".map(tr => tr.getBoundingClientRect().height)) / "
                         "parseFloat(getComputedStyle(s.querySelector('td')).fontSize)])")
        assert all(overflow <= 0 and rows_em < 7 for overflow, rows_em in fit), fit
    finally:
        browser.call("Emulation.setDeviceMetricsOverride", {
            "width": 1200, "height": 800, "deviceScaleFactor": 1, "mobile": False})


def test_no_page_scrolls_sideways_in_a_1000_px_window(report, browser):
    """Wide content scrolls in its own box (tables, graphs, source) or wraps; the page itself
    never needs a horizontal scroll (the run's 21-key configuration, one table row, once made
    the front page 1490 px wide; at 1000 px the per-rank tables did too)."""
    pages = sorted(report.rglob("*.html"))
    assert len(pages) > 5
    browser.call("Emulation.setDeviceMetricsOverride", {
        "width": 1000, "height": 800, "deviceScaleFactor": 1, "mobile": False})
    wide = []
    try:
        for page in pages:
            browser.open(page.as_uri())
            width, window = browser.js("[document.documentElement.scrollWidth, "
                                       "document.documentElement.clientWidth]")
            if width > window:
                wide.append((str(page.relative_to(report)), width, window))
        browser.open((report / "index.html").as_uri())
        config = browser.js("[...document.querySelectorAll('dl.config > div')]"
                            ".map(d => d.querySelector('dt').textContent)")
    finally:
        browser.call("Emulation.setDeviceMetricsOverride", {
            "width": 1200, "height": 800, "deviceScaleFactor": 1, "mobile": False})
    assert wide == []
    assert {"tp", "pp", "schedule", "microbatches"} <= set(config), config


def test_call_graphs_open_on_the_training_step(report):
    summary = json.loads((report / "summary.json").read_text())
    whole = sum(sum(r["op_counts"].values()) for r in summary["ranks"].values())

    def ops_in(svg: str) -> int:
        title = re.search(r"ranks \S+ · ([0-9,]+) ops", (report / "callgraphs" / svg)
                          .read_text())
        return int(title.group(1).replace(",", ""))

    training, setup = ops_in("all.svg"), ops_in("setup.svg")
    assert 0 < training < whole and training + setup == whole
    page = (report / "callgraphs" / "all.html").read_text()
    assert "<h1>Call graph: all ranks merged, step 1</h1>" in page
    assert 'href="setup.html"' in page
    setup_page = (report / "callgraphs" / "setup.html").read_text()
    assert "setup and uncounted steps, steps 0, 2" in setup_page
    # building the model is setup: its __init__ is in the setup graph, not the step's
    assert "GPTChunk.__init__" in (report / "callgraphs" / "setup.svg").read_text()
    assert "GPTChunk.__init__" not in (report / "callgraphs" / "all.svg").read_text()
    # per-rank graphs show the step too; each rank's ops add up to its events in step 1 (the
    # graph its rank page links: ranks that did the same work share one)
    from tracer import load
    from tracer.vocab.ops import PSEUDO_OPS
    for rank in range(4):
        graph = re.search(r'href="\.\./callgraphs/(rank-\d+)\.html">Call graph of rank',
                          (report / "ranks" / f"rank-{rank}.html").read_text()).group(1)
        t = load(str(report / "traces" / f"rank-{rank}.arrow"))
        ops = t.dictionary("op")
        want = sum(1 for op, step in zip(t.col("op").tolist(), t.col("step").tolist())
                   if step == 1 and ops[op] not in PSEUDO_OPS)
        assert ops_in(f"{graph}.svg") == want
    index = parse(report / "index.html").links
    assert "callgraphs/setup.html" in index and "timeline.html" in index


def test_every_page_of_a_report_with_setup_loads_cleanly(report, browser, tmp_path):
    for page in ("callgraphs/setup.html", "timeline.html", "modules.html"):
        browser.console.clear()
        browser.open((report / page).as_uri())
        assert browser.console == [], (page, browser.console)
        assert not blank(browser.screenshot(tmp_path / "page.png")), page
    assert check_links(report) > 500


def test_trace_text_is_escaped_on_the_front_page_and_in_search(tmp_path, browser):
    """Op names, function names and files from a trace reach the front page's tables, the
    call graphs and the search box's list; none of them may run."""
    from support.constructed.synthetic import SyntheticRank
    evil = '<img src=x onerror="window.pwned=1">'
    stack = [("evil</td><script>window.pwned=2</script>.py", 3, "f", evil)]
    ranks = []
    for rank in range(2):
        r = SyntheticRank(rank, 2)
        for step in range(3):
            base = 100 * step
            r.op(base, base + 10, name=f"aten.{evil}.default", stack=stack)
            r.comm("all_reduce", base + 10, base + 11, base + 20, group=(0, 1), stack=stack)
            r.next_step(base + 50)
        ranks.append(r)
        r.write(tmp_path / "run" / "traces")
    index = Path(build(str(tmp_path / "run"), str(tmp_path / "out"))[0])
    html = index.read_text()
    assert "<script>window" not in html and "<img src=x" not in html
    assert "&lt;img src=x" in html
    for page in (index, tmp_path / "out" / "callgraphs" / "all.html"):
        browser.console.clear()
        browser.open(page.as_uri())
        options = browser.js("[...document.querySelectorAll('datalist option')]"
                             ".map(o => o.value)")
        if page.name == "all.html":
            assert evil in options                    # the name, as text
            browser.js("document.querySelector('.svgtools input').focus()")
            browser.type("onerror")
            browser.key("Enter")
        assert browser.js("window.pwned === undefined"), page
        assert browser.console == [], (page, browser.console)


def test_a_run_without_a_pipeline_shows_no_passes_nor_bubble(tmp_path, browser):
    """Two data-parallel ranks, no pipeline, no F/B/W pass: the timeline's legend keys no pass,
    and the headline's last share is not a "bubble (theory)" but the step without compute.
    Each counted step (units of us): ops [0, 40) and [100, 140), an all-reduce launched at 40
    that completes at 100 (the host waits in between: not compute), the next step at 140. So
    compute is 80 of 140: 60/140 = 43 % without compute, 40/140 the bar's communication."""
    from support.constructed.synthetic import SyntheticRank
    for rank in (0, 1):
        r = SyntheticRank(rank, 2, {"tp": 1, "pp": 1, "dp": 2})
        for step in range(3):
            base = 140 * step
            r.op(base, base + 40, stack=[("/src/train.py", 5, "step", "step")])
            r.comm("all_reduce", base + 40, base + 41, base + 100, group=(0, 1),
                   phase="grad_sync", stack=[("/src/train.py", 9, "step", "step")])
            r.op(base + 100, base + 140, stack=[("/src/train.py", 6, "step", "step")])
            r.next_step(base + 140)
        r.write(tmp_path / "run" / "traces")
    index = Path(build(str(tmp_path / "run"), str(tmp_path / "out"))[0])
    browser.console.clear()
    browser.open(index.as_uri())
    assert browser.console == [], browser.console
    headings = browser.js("[...document.querySelectorAll('table.headline th')]"
                          ".map(th => th.textContent.trim())")
    col = {h: i for i, h in enumerate(headings)}
    assert "no compute" in col and not any("bubble" in h for h in headings), headings
    rows = rows_of(browser, "table.headline")
    assert [row[col["no compute"]] for row in rows] == [f"{100 * 60 / 140:.0f} %"] * 2 == \
        ["43 %"] * 2
    # time per phase beside the step, no annotation needed: the ops' forward 40 + 40, the
    # all-reduce's grad_sync from its launch to its completion 60 (docs/metrics.md)
    assert headings[2:5] == ["step time", "forward", "grad_sync"], headings
    assert [row[3:5] for row in rows] == [["80.0 us", "60.0 us"]] * 2
    note = browser.js("document.querySelector('table.headline').nextElementSibling"
                      ".textContent")
    assert "no compute: the share of the step without compute" in note
    assert "theoretical" not in note and "pipeline bubble" not in note
    legend = browser.js("[...document.querySelectorAll('a.preview svg > text')]"
                        ".map(t => t.textContent)")
    assert "computing" in legend and "idle" in legend, legend
    assert not {"forward pass (micro-batch)", "backward pass",
                "weight-gradient pass"} & set(legend), legend
    assert not browser.js("document.querySelector('a.preview svg .pass')")
    ranks = browser.js("[...document.querySelectorAll('main > table')].find(t => "
                       "t.textContent.includes('comm bytes')).rows[0].textContent")
    assert "no compute" in ranks and "bubble" not in ranks
