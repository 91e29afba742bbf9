"""Pan, zoom and search of the report's pictures (viz/templates/svgview.js), driven with real
input events through headless Chromium on the session's two-step run (conftest.two_step_run):
a drag moves the view by exactly the pixels dragged and does not follow the link under it, a
wheel turn zooms about the pointer, + - arrows and 0 do what they say, search centres on a
function and steps through an op's leaves, and the timeline and diff pages zoom too.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from support.browser import blank, box_centre, fitted, view_box


@pytest.fixture(scope="module")
def report(two_step_run) -> Path:
    return two_step_run


def test_drag_wheel_and_keys_pan_and_zoom_the_call_graph(report, browser):
    browser.open((report / "callgraphs" / "all.html").as_uri())
    url = browser.js("location.href")
    cx, cy, bw, bh = box_centre(browser)
    x, y, w, h = view_box(browser)
    assert abs(w / h - bw / bh) < 0.01          # the view keeps the box's shape: no letterbox
    scale = bw / w                              # px per user unit
    # drag: the picture follows the pointer
    browser.drag(cx, cy, cx - 200, cy - 100)
    x1, y1, w1, h1 = view_box(browser)
    assert (w1, h1) == (w, h)
    assert abs((x1 - x) * scale - 200) < 2 and abs((y1 - y) * scale - 100) < 2
    assert browser.js("location.href") == url   # a drag over a node does not follow its link
    # wheel: zoom in at the pointer, the point under it stays put
    px, py = cx + 150, cy - 80
    before = (x1 + (px - (cx - bw / 2)) / scale, y1 + (py - (cy - bh / 2)) / scale)
    browser.wheel(px, py, -300)
    x2, y2, w2, h2 = view_box(browser)
    assert w2 < w1 * 0.8
    scale2 = bw / w2
    after = (x2 + (px - (cx - bw / 2)) / scale2, y2 + (py - (cy - bh / 2)) / scale2)
    assert abs(after[0] - before[0]) < 1 and abs(after[1] - before[1]) < 1
    # keys: - and + zoom by 1.25 about the centre, arrows pan, 0 fits the whole graph
    browser.key("-")
    assert abs(view_box(browser)[2] - w2 * 1.25) < 0.05
    browser.key("+")
    assert abs(view_box(browser)[2] - w2) < 0.05
    browser.key("ArrowRight")
    x3 = view_box(browser)[0]
    assert abs((x3 - x2) - 0.15 * w2) < 0.05
    browser.key("0")
    assert fitted(view_box(browser), report / "callgraphs" / "all.svg")
    assert browser.console == [], browser.console


def test_search_centres_on_a_function_and_an_op(report, browser):
    browser.open((report / "callgraphs" / "all.html").as_uri())
    browser.key("/")                            # focuses the search box
    assert browser.js("document.activeElement.type") == "search"
    browser.type("RowParallelLinear.forward")
    browser.key("Enter")
    found = browser.js("[...document.querySelectorAll('g.node.found')].map(g => "
                       "g.querySelector('text').textContent)")
    assert found == ["RowParallelLinear.forward"]
    cx, cy, _, _ = box_centre(browser)
    centre = browser.js("(() => { const r = document.querySelector('g.node.found')"
                        ".getBoundingClientRect(); return [r.left + r.width / 2, "
                        "r.top + r.height / 2]; })()")
    assert abs(centre[0] - cx) < 3 and abs(centre[1] - cy) < 3, (centre, cx, cy)
    assert browser.js("document.querySelector('.svgstatus').textContent")\
        .startswith("1 of 1: RowParallelLinear.forward")
    # an op name finds the leaves that issued it; Enter goes on to the next one
    browser.js("(() => { const s = document.querySelector('.svgtools input');"
               " s.value = ''; s.focus(); })()")
    browser.type("all_reduce")
    status = browser.js("document.querySelector('.svgstatus').textContent")
    count = int(status.split()[0])
    assert count >= 2 and browser.js("document.querySelectorAll('g.node.match').length") == count
    browser.key("Enter")
    browser.key("Enter")
    assert browser.js("document.querySelector('.svgstatus').textContent").startswith("2 of ")
    browser.js("(() => { const s = document.querySelector('.svgtools input');"
               " s.value = ''; s.focus(); })()")
    browser.type("no_such_function_anywhere")
    assert browser.js("document.querySelector('.svgstatus').textContent") == "no match"
    assert browser.console == [], browser.console


def test_timeline_and_diff_pages_pan_and_zoom(report, browser, tmp_path):
    from viz import diff
    from viz.render import render_all
    from viz.render.diff import FILES, DiffInput
    from viz.run import open_run
    result = diff.diff_runs(open_run(str(report)), open_run(str(report)))
    render_all(FILES, DiffInput(result), str(tmp_path / "diff"))
    for page, svg in ((report / "timeline.html", report / "timeline.svg"),
                      (tmp_path / "diff" / "diff.html", tmp_path / "diff" / "diff-callgraph.svg")):
        browser.console.clear()
        browser.open(page.as_uri())
        views = browser.js("document.querySelectorAll('div.svgview.live').length")
        assert views >= 1, page
        x, y, w, h = view_box(browser)
        if page.name == "timeline.html":
            assert fitted([x, y, w, h], svg)       # a timeline opens whole
        cx, cy, _, _ = box_centre(browser)
        browser.wheel(cx, cy, -200)
        assert view_box(browser)[2] < w * 0.8, page
        browser.drag(cx, cy, cx + 50, cy)
        browser.key("0")
        assert fitted(view_box(browser), svg), page
        assert browser.console == [], (page, browser.console)
        assert not blank(browser.screenshot(tmp_path / "page.png")), page
