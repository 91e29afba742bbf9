"""The offline HTML report of a real traced run, opened in headless Chromium.

The run is the session's ``callgraph_run`` (tests/support/traced_runs.py: TP=2 x PP=2 on 4 ranks).
The report is built the way ``trace-report`` builds it (viz.cli.build: summary.json, then the
report). Checks: every page type loads in Chromium without a console message and renders something
(not a blank screenshot); every local href/src in every page and SVG resolves, fragments included;
nothing points off the machine; problems (hang, failed, missing ranks) come first on index.html;
text from traces is escaped. Chromium is required: without it the browser tests fail (CI installs
it).
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from support.browser import blank, chromium
from support.html_links import check_links, parse
from support.paths import line_of
from support.traced_runs import TP_FILE
from support.constructed.synthetic import SyntheticRank
from viz.cli import build

MAX_SVG_NODES = 150 + 6          # the cap, plus the legend's sample nodes


@pytest.fixture(scope="module")
def report(callgraph_run, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report")
    index, _ = build(str(callgraph_run), str(out))
    assert index == str(out / "index.html")
    return out


def test_the_browser_checks_can_fail(tmp_path):
    page = tmp_path / "broken.html"
    page.write_text("<!DOCTYPE html><html><body style='background:#fff'>"
                    "<script>console.error('boom'); no_such_function();</script></body></html>")
    console = chromium(page.as_uri(), tmp_path / "broken.png")
    assert any("boom" in line for line in console)
    assert any("no_such_function" in line for line in console)
    assert blank(tmp_path / "broken.png")


@pytest.mark.parametrize("page", [
    "index.html", "timeline.html", "callgraphs/all.html", "callgraphs/rank-2.html",
    "modules.html",
    "ranks/rank-0.html", "source/sample_runs__parallel__tensor_parallel.py.html"])
def test_pages_load_in_chromium(report, page, tmp_path):
    png = tmp_path / "page.png"
    console = chromium((report / page).as_uri(), png)
    assert console == [], f"{page}: console messages:\n" + "\n".join(console)
    assert not blank(png), f"{page}: blank screenshot"


def test_every_local_link_resolves_and_nothing_is_external(report):
    assert check_links(report) > 500
    index = parse(report / "index.html").links
    for wanted in ("callgraphs/all.html", "callgraphs/rank-0.html", "callgraphs/rank-2.html",
                   "modules.html", "summary.json", "ranks/rank-2.html", "timeline.html",
                   "timeline.svg", "timeline.json"):
        assert wanted in index, f"index.html does not link {wanted}"
    # every page loads the one shared script, from the report's top directory
    for page in ("index.html", "callgraphs/all.html", "source/sample_runs__train.py.html"):
        assert parse(report / page).links.count(
            "../" * page.count("/") + "svgview.js") == 1, page


def test_ranks_that_did_the_same_work_share_one_call_graph(report):
    """The two TP ranks of each pipeline stage run the same ops on the same shapes: one graph
    per stage, named for both ranks, linked from each rank; the stages differ, so two graphs."""
    graphs = sorted(p.name for p in (report / "callgraphs").glob("rank-*"))
    assert graphs == ["rank-0.html", "rank-0.svg", "rank-2.html", "rank-2.svg"]
    for first, ranks in ((0, "0-1"), (2, "2-3")):
        page = (report / "callgraphs" / f"rank-{first}.html").read_text()
        assert f"<h1>Call graph: ranks {ranks} (the same work), " in page
        assert f"The graph and its times are rank {first}&#39;s" in page
    index = parse(report / "index.html").links
    for rank in range(4):
        want = f"callgraphs/rank-{rank // 2 * 2}.html"
        assert index.count(want) == 2 * 2 + 1, rank       # two tables a rank, Explore once
        mine = (report / "ranks" / f"rank-{rank}.html").read_text()
        assert f'<a href="../{want}">Call graph of rank {rank}</a> (drawn once for ranks ' \
               f'{rank // 2 * 2}-{rank // 2 * 2 + 1}: they did the same work)' in mine


def test_svgs_are_capped_and_every_node_links_to_source(report):
    svgs = sorted((report / "callgraphs").glob("*.svg"))
    assert len(svgs) >= 6
    for svg in svgs:
        text = svg.read_text()
        nodes = text.count('class="node"')
        assert 6 < nodes <= MAX_SVG_NODES, f"{svg.name}: {nodes} nodes"
        # every graph node but the legend's is an <a> link
        assert text.count("<a xlink:href=") >= nodes - 6, svg.name


def test_source_page_shows_the_ops_a_line_issued(report):
    line = line_of(TP_FILE, "reduce_from_tensor_parallel_region(partial")
    page = (report / "source" / "sample_runs__parallel__tensor_parallel.py.html").read_text()
    row = re.search(rf'<tr id="L{line}" class="hot">(.*?)</tr>', page, re.S)
    assert row, f"line {line} is not marked as issuing ops"
    # g after attn.proj and mlp.fc2, summed over the 4 ranks (as in test_callgraph.py)
    assert re.search(r'class="comm">forward: all_reduce x16 ', row.group(1)), row.group(1)
    assert "ops in the functions it calls" in row.group(1)


# ------------------------------------------------------------------------------ problems
def test_index_puts_the_hang_first_and_escapes_trace_text(callgraph_run, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(callgraph_run, run_dir)
    (run_dir / "traces" / "rank-3.arrow").unlink()
    # a run.json of before its failures were facts: its sentences read as they were written
    (run_dir / "run.json").write_text(json.dumps({
        "command": "trace-run train.py --name '<script>alert(1)</script>'", "exit_code": 1,
        "world_size": 4,
        "ranks": {"1": {"status": "failed", "exit_code": 1, "error": "RuntimeError: boom"}},
        "hang": {"timeout_s": 30, "never_arrived": [2], "ranks": {
            "0": {"last_collective": {"kind": "all_reduce", "seq": 7}, "inflight": [],
                  "stack": "train.py:10"}}}}))
    index = Path(build(str(run_dir), str(tmp_path / "out"))[0])
    html = index.read_text()
    main = html[html.index("<main>"):]
    banners = re.findall(r'<div class="banner (\w+)"><strong>(.*?)</strong>', main)
    assert banners[0] == ("hang", "Hang: rank 2 never arrived (watchdog timeout 30 s)")
    assert ("failed", "rank 1 failed: RuntimeError: boom") in banners
    assert any(level == "missing" and title.startswith("rank 3: no trace")
               for level, title in banners)
    assert main.index("Hang: rank 2") < main.index("<h2>Run</h2>")
    assert "<script>alert" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "ranks/rank-3.html" not in html and not (tmp_path / "out/ranks/rank-3.html").exists()


def test_a_hang_with_no_rank_missing_says_so_rather_than_naming_none():
    from viz.views.failures import banner
    every = {"timeout_s": 8, "kind": "collective", "never_arrived": [], "ranks": {}}
    assert banner(every) == \
        "Hang: every rank waited in a collective, none was missing from it (watchdog timeout 8 s)"
    assert banner(dict(every, never_arrived=[1, 3])) == \
        "Hang: ranks 1, 3 never arrived (watchdog timeout 8 s)"


def test_a_run_that_recorded_nothing_still_gets_a_report(tmp_path):
    """A rank that failed before its first op: empty graphs, the failure shown, links intact."""
    traces = tmp_path / "traces"
    traces.mkdir()
    SyntheticRank(0, 2, meta={"error": "RuntimeError: <init> failed"}).write(traces,
                                                                              status="failed")
    out = tmp_path / "out"
    index = Path(build(str(tmp_path), str(out))[0])
    html = index.read_text()
    assert "rank 0 failed: RuntimeError: &lt;init&gt; failed" in html
    assert "rank 1: no trace" in html
    for page in out.rglob("*.html"):
        for link in parse(page).links:
            path = urlsplit(link).path
            assert not path or (page.parent / unquote(path)).exists(), f"{page}: {link}"


def test_front_page_and_modules_say_only_what_applies(tmp_path):
    """No pipeline: the lede names no schedule or micro-batches, no 'sp' without TP, and the
    bubble column shows no theory; the modules page counts every phase's ops (the optimizer's
    were in no column of 'forward / backward / other')."""
    traces = tmp_path / "traces"
    config = {"tp": 1, "sp": True, "pp": 1, "dp": 2, "schedule": "1f1b", "microbatches": 4}
    for rank in (0, 1):
        r = SyntheticRank(rank, 2, config)
        t = 0
        for step in range(3):
            for phase, n in (("forward", 3), ("backward", 5), ("grad_sync", 0),
                             ("optimizer", 7)):
                for _ in range(n):
                    r.op(t, t + 4, phase=phase, module=None if phase == "optimizer"
                         else "GPT.block", stack=[("/src/train.py", 5, "step", "step")])
                    t += 5
            r.comm("all_reduce", t, t + 1, t + 9, group=(0, 1), phase="grad_sync",
                   stack=[("/src/train.py", 9, "step", "step")])
            t += 10
            r.next_step(t)
        r.write(traces)
    out = tmp_path / "out"
    html = Path(build(str(tmp_path), str(out))[0]).read_text()
    lede = re.search(r'<p class="lede">(.*?)</p>', html, re.S)
    assert lede, html[:2000]
    words = re.sub(r"<[^>]+>", " ", lede.group(1))
    assert "dp 2" in words and "sp" not in words.split() and "1f1b" not in words \
        and "micro-batches" not in words, words
    assert "(0 %)" not in html and 'title="no compute bubble"' in html
    modules = (out / "modules.html").read_text()
    cells = {re.sub(r"<[^>]+>", "", name).strip(): phases for name, phases in re.findall(
        r'<tr>\s*<td>(.*?)</td>.*?<td class="phases">(.*?)</td>', modules, re.S)}
    # steps 1 and 2 counted (step 0 is the setup), 2 ranks
    assert cells["(no module)"].split("<br>") == ["grad sync 4", "optimizer 28"]
    assert cells["GPT"].split("<br>") == ["forward 12", "backward 20"]
