"""The report as a person uses it, driven through real headless Chromium (DevTools protocol).

The run: the reference GPT (TP=2 without SP x PP=2, 4 ranks) for two optimizer steps, so the
recording holds setup and step 0, one counted training step, and an unfinished tail. Checks: the
front page shows the timeline picture, a line per rank with summary.json's numbers, the top ops
and collectives with links to their source lines; the call graphs show the counted step and
setup has its own graph whose ops add up with it to the whole recording; real mouse drags and
wheel turns and real key presses change the SVG's viewBox the way they should (pan, zoom, fit);
the search box finds a node and centres on it; no page logs to the console; screenshots are not
blank; every link of the new pages resolves; text from a trace is escaped on the front page.
"""
from __future__ import annotations

import atexit
import base64
import fcntl
import functools
import json
import os
import queue
import re
import shutil
import subprocess
import tempfile
import threading
from collections import Counter
from pathlib import Path

import pytest

import gpt_helpers
from test_callgraph import ARGS
from test_report import CHROMIUM, blank, parse
from viz.cli import build

REPO = Path(__file__).resolve().parent.parent
TWO_STEPS = [a if a != "1" or ARGS[i - 1] != "--steps" else "2" for i, a in enumerate(ARGS)]


@functools.lru_cache(maxsize=None)
def two_step_run() -> str:
    """Trace the reference GPT for two steps once per test session; returns the run dir (its
    report built by trace-report's code path into it). test_report_sql.py reuses it."""
    out = tempfile.mkdtemp(prefix="paratrace-two-steps-")
    atexit.register(shutil.rmtree, out, True)
    proc = gpt_helpers.launch(4, [os.path.join(out, "traces"), *TWO_STEPS],
                              script=str(REPO / "tests" / "gpt_helpers.py"))
    assert proc.returncode == 0, f"traced run failed:\n{proc.stdout}\n{proc.stderr[-4000:]}"
    build(out)
    return out


@pytest.fixture(scope="module")
def report() -> Path:
    return Path(two_step_run())


# ------------------------------------------------------------------------------ browser
class Browser:
    """Headless Chromium driven over the DevTools protocol on a pipe (--remote-debugging-pipe):
    real input events, page evaluation, screenshots and every console message and exception."""

    def __init__(self, width: int = 1200, height: int = 800):
        assert os.path.exists(CHROMIUM), "chromium is not installed (apt-get install chromium)"
        self.profile = tempfile.mkdtemp(prefix="paratrace-cdp-")
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()
        # Chromium reads commands on fd 3 and writes answers on fd 4: move the child's ends
        # above them first, so that setting up one cannot overwrite the other (and use bash:
        # dash redirects single-digit fds only).
        to_chrome_r, from_chrome_w = (_high_fd(fd) for fd in (to_chrome_r, from_chrome_w))
        self.proc = subprocess.Popen(
            ["/bin/bash", "-c", f'exec "$0" "$@" 3<&{to_chrome_r} 4>&{from_chrome_w}', CHROMIUM,
             "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={self.profile}", "--remote-debugging-pipe",
             f"--window-size={width},{height}", "about:blank"],
            pass_fds=(to_chrome_r, from_chrome_w), stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._next_id = 0
        self._answers: dict = {}
        self._events: queue.Queue = queue.Queue()
        self._lock = threading.Condition()
        self.console: list = []
        threading.Thread(target=self._read, daemon=True).start()
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.send("Target.attachToTarget", {"targetId": target,
                                                           "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable")
        self.call("Emulation.setDeviceMetricsOverride", {
            "width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})

    def _read(self) -> None:
        buffer = b""
        with os.fdopen(self._from_chrome, "rb", buffering=0) as pipe:
            while True:
                chunk = pipe.read(1 << 16)
                if not chunk:
                    return
                buffer += chunk
                while b"\0" in buffer:
                    raw, buffer = buffer.split(b"\0", 1)
                    message = json.loads(raw)
                    if "id" in message:
                        with self._lock:
                            self._answers[message["id"]] = message
                            self._lock.notify_all()
                    else:
                        self._event(message)

    def _event(self, message: dict) -> None:
        method, params = message.get("method"), message.get("params", {})
        if method == "Runtime.consoleAPICalled":
            self.console.append(f"console.{params['type']}: " + " ".join(
                str(a.get("value", a.get("description", ""))) for a in params["args"]))
        elif method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            self.console.append("exception: " + details.get("exception", {}).get(
                "description", details.get("text", "")))
        elif method == "Log.entryAdded":
            self.console.append(f"log {params['entry']['level']}: {params['entry']['text']}")
        self._events.put(message)

    def send(self, method: str, params: dict = None, session: str = None) -> dict:
        with self._lock:
            self._next_id += 1
            ident = self._next_id
        message = {"id": ident, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_chrome, json.dumps(message).encode() + b"\0")
        with self._lock:
            assert self._lock.wait_for(lambda: ident in self._answers, timeout=60), method
            answer = self._answers.pop(ident)
        assert "error" not in answer, f"{method}: {answer['error']}"
        return answer["result"]

    def call(self, method: str, params: dict = None) -> dict:
        return self.send(method, params, self.session)

    def open(self, url: str) -> None:
        while not self._events.empty():
            self._events.get_nowait()
        self.call("Page.navigate", {"url": url})
        while True:
            event = self._events.get(timeout=60)
            if event.get("method") == "Page.loadEventFired":
                return

    def js(self, expression: str):
        result = self.call("Runtime.evaluate", {"expression": expression,
                                                "returnByValue": True})
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return result["result"].get("value")

    def mouse(self, kind: str, x: float, y: float, **extra) -> None:
        self.call("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y, **extra})

    def drag(self, x0: float, y0: float, x1: float, y1: float, steps: int = 5) -> None:
        self.mouse("mouseMoved", x0, y0)
        self.mouse("mousePressed", x0, y0, button="left", buttons=1, clickCount=1)
        for i in range(1, steps + 1):
            self.mouse("mouseMoved", x0 + (x1 - x0) * i / steps, y0 + (y1 - y0) * i / steps,
                       button="left", buttons=1)
        self.mouse("mouseReleased", x1, y1, button="left", buttons=0, clickCount=1)

    def wheel(self, x: float, y: float, delta_y: float) -> None:
        self.mouse("mouseWheel", x, y, deltaX=0, deltaY=delta_y)

    KEYS = {"+": ("Equal", 187), "-": ("Minus", 189), "0": ("Digit0", 48),
            "ArrowLeft": ("ArrowLeft", 37), "ArrowRight": ("ArrowRight", 39),
            "ArrowUp": ("ArrowUp", 38), "ArrowDown": ("ArrowDown", 40),
            "Enter": ("Enter", 13), "/": ("Slash", 191)}

    def key(self, key: str) -> None:
        code, vk = self.KEYS[key]
        text = key if len(key) == 1 else ("\r" if key == "Enter" else None)
        down = {"type": "keyDown" if text else "rawKeyDown", "key": key, "code": code,
                "windowsVirtualKeyCode": vk, "nativeVirtualKeyCode": vk}
        if text:
            down["text"] = text
        self.call("Input.dispatchKeyEvent", down)
        self.call("Input.dispatchKeyEvent", {"type": "keyUp", "key": key, "code": code,
                                             "windowsVirtualKeyCode": vk})

    def type(self, text: str) -> None:
        self.call("Input.insertText", {"text": text})

    def screenshot(self, path: Path) -> Path:
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot",
                                                    {"format": "png"})["data"]))
        return path

    def close(self) -> None:
        try:
            self.send("Browser.close")
        except (AssertionError, OSError):
            pass
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._to_chrome)
        shutil.rmtree(self.profile, ignore_errors=True)


def _high_fd(fd: int) -> int:
    high = fcntl.fcntl(fd, fcntl.F_DUPFD, 10)
    os.close(fd)
    return high


@pytest.fixture(scope="module")
def browser():
    b = Browser()
    yield b
    b.close()


def fitted(view: list, svg_file: Path) -> bool:
    """Whether ``view`` shows all of the picture in ``svg_file`` and no more than it must."""
    x, y, w, h = map(float, re.search(r'viewBox="([-0-9. ]+)"', svg_file.read_text())
                     .group(1).split())
    vx, vy, vw, vh = view
    inside = vx <= x + 0.5 and vy <= y + 0.5 and vx + vw >= x + w - 0.5 and \
        vy + vh >= y + h - 0.5
    return inside and min(abs(vw - w), abs(vh - h)) < 0.5


def view_box(browser: Browser, index: int = 0) -> list:
    text = browser.js(f"document.querySelectorAll('div.svgview svg')[{index}]"
                      ".getAttribute('viewBox')")
    return [float(v) for v in text.split()]


def box_centre(browser: Browser, index: int = 0) -> tuple:
    r = browser.js(f"(() => {{ const box = document.querySelectorAll('div.svgview')[{index}];"
                   "box.scrollIntoView({block: 'nearest'}); const r = box.getBoundingClientRect();"
                   " return [r.left + r.width / 2, r.top + r.height / 2, r.width, r.height];"
                   " })()")
    return tuple(r)


# ------------------------------------------------------------------------------ tests
def test_the_browser_driver_sees_console_errors(browser, tmp_path):
    page = tmp_path / "broken.html"
    page.write_text("<!DOCTYPE html><html><body><script>console.error('boom');"
                    "no_such_function();</script></body></html>")
    browser.console.clear()
    browser.open(page.as_uri())
    assert any("boom" in line for line in browser.console)
    assert any("no_such_function" in line for line in browser.console)
    browser.console.clear()


def rows_of(browser: Browser, selector: str) -> list:
    """The text of every data row of the first table matching ``selector``."""
    return browser.js(f"Array.from(document.querySelector({json.dumps(selector)}).rows)"
                      ".slice(1).map(tr => Array.from(tr.cells).map(c => c.textContent.trim()))")


def counted_steps(summary: dict) -> set:
    return {s for r in summary["ranks"].values() for s in r["time"]["counted_steps"]}


def top_by_time(run_dir: str, steps: set, comm: bool) -> list:
    """Ops (or collectives by kind and phase) by summed duration over ``steps``, all ranks,
    straight from the trace columns: what the front page's tables must say."""
    from tracer import load
    from tracer.labels import PHASES
    from tracer.ops import PSEUDO_OPS
    totals: Counter = Counter()
    calls: Counter = Counter()
    for path in sorted(Path(run_dir, "traces").glob("rank-*.arrow")):
        t = load(str(path))
        ops, kinds = t.dictionary("op"), t.dictionary("kind")
        for op, kind, phase, step, t0, t1 in zip(
                t.col("op").tolist(), t.col("kind").tolist(), t.col("phase").tolist(),
                t.col("step").tolist(), t.col("t0").tolist(), t.col("t1").tolist()):
            if step not in steps or ops[op] in PSEUDO_OPS or (kind >= 0) != comm:
                continue
            key = f"{kinds[kind]} ({PHASES[phase]})" if comm else ops[op]
            totals[key] += max(t1 - t0, 0) if t1 >= 0 else 0
            calls[key] += 1
    return [(key, calls[key], ns) for key, ns in totals.most_common(5)]


def test_front_page_answers_what_happened(report, browser, tmp_path):
    from viz.render import fmt_count, fmt_time, short_op
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
    # one line per rank with summary.json's numbers, per counted step
    rows = rows_of(browser, "table.headline")
    assert [r[0] for r in rows] == ["0", "1", "2", "3"]
    for row in rows:
        time = summary["ranks"][row[0]]["time"]
        n = len(time["counted_steps"])
        assert row[1] == "ok"
        assert row[2] == fmt_time(time["wall_s"] / n * 1e9)
        assert row[4] == fmt_time(time["compute_s"] / n * 1e9)
        assert row[5] == fmt_time(time["exposed_comm_s"] / n * 1e9)
        assert row[6] == f"{100 * time['overlap_fraction']:.0f} %"
        assert row[7] == (f"{100 * time['pipeline']['bubble_fraction']:.0f} % "
                          f"({100 * time['theoretical_bubble_fraction']:.0f} %)")
        assert row[8] == "host"
    bars = browser.js("[...document.querySelectorAll('table.headline .bar')].map(b => "
                      "[...b.children].reduce((s, c) => s + c.getBoundingClientRect().width, 0)"
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
    # per-rank graphs show the step too; each rank's ops add up to its events in step 1
    from tracer import load
    from tracer.ops import PSEUDO_OPS
    for rank in range(4):
        t = load(str(report / "traces" / f"rank-{rank}.arrow"))
        ops = t.dictionary("op")
        want = sum(1 for op, step in zip(t.col("op").tolist(), t.col("step").tolist())
                   if step == 1 and ops[op] not in PSEUDO_OPS)
        assert ops_in(f"rank-{rank}.svg") == want
    index = parse(report / "index.html").links
    assert "callgraphs/setup.html" in index and "timeline.html" in index


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
    from viz.run import open_run
    result = diff.diff_runs(open_run(str(report)), open_run(str(report)))
    diff.write_diff(result, str(tmp_path / "diff"))
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


def test_every_page_of_a_report_with_setup_loads_cleanly(report, browser, tmp_path):
    for page in ("callgraphs/setup.html", "timeline.html", "modules.html"):
        browser.console.clear()
        browser.open((report / page).as_uri())
        assert browser.console == [], (page, browser.console)
        assert not blank(browser.screenshot(tmp_path / "page.png")), page
    from test_report import check_links
    assert check_links(report) > 500


def test_trace_text_is_escaped_on_the_front_page_and_in_search(tmp_path, browser):
    """Op names, function names and files from a trace reach the front page's tables, the
    call graphs and the search box's list; none of them may run."""
    from tracer.synthetic import SyntheticRank
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
