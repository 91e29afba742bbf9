"""The report's smaller pages, as a new user met them (issue 51): a rank's ops sorted by time,
its memory by source line linked to the source pages (the tiny GPT under DDP with --memory: the
session's ``wrapped_runs``), and the front page naming where a ``tracer.trace`` directory's
traces are (its rank files at its top, not under traces/)."""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

import tracer
from support.constructed.synthetic import SyntheticRank, write_run
from support.html_links import parse
from tracer.vocab.labels import PHASES
from tracer.vocab.ops import PSEUDO_OPS
from viz.cli import build

UNITS = {"ns": 1, "us": 1e3, "ms": 1e6, "s": 1e9}


def ns(text: str) -> float:
    value, unit = text.split()
    return float(value) * UNITS[unit]


@pytest.fixture(scope="module")
def report(wrapped_runs, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ddp-report")
    build(wrapped_runs["ddp"], str(out))
    return out


def table_after(page: str, heading: str) -> list:
    """The cells of each row of the first table after ``heading``."""
    table = page.split(heading, 1)[1].split("<table", 1)[1].split("</table>", 1)[0]
    return [[re.sub(r"<[^>]+>", "", c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row,
                                                                     re.S)]
            for row in re.findall(r"<tr>(.*?)</tr>", table, re.S) if "<td" in row]


def test_a_ranks_ops_are_sorted_by_time(wrapped_runs, report):
    page = (report / "ranks" / "rank-0.html").read_text()
    rows = table_after(page, "<h2>Ops</h2>")
    times = [ns(r[4]) for r in rows]
    assert len(rows) > 20 and times == sorted(times, reverse=True)
    # the first is the (op, phase) with the most time, summed straight from the trace
    trace = tracer.load(str(Path(wrapped_runs["ddp"]) / "traces" / "rank-0.arrow"))
    ops, phases = trace.dictionary("op"), trace.col("phase")
    total: Counter = Counter()
    for code, phase, t0, t1 in zip(trace.col("op"), phases, trace.col("t0"), trace.col("t1")):
        if t1 >= 0 and ops[code] not in PSEUDO_OPS:
            total[(ops[code], PHASES[phase])] += t1 - t0
    (top, _), = total.most_common(1)
    assert (rows[0][0], rows[0][1]) == top


def test_memory_by_source_line_links_to_the_source_pages(report):
    rank_page = report / "ranks" / "rank-0.html"
    page = rank_page.read_text()
    section = page.split("<h3>by source line</h3>", 1)[1].split("</table>", 1)[0]
    links = re.findall(r'<a href="([^"]+)"><code>(.*?)</code></a>', section)
    assert links, section
    for href, shown in links:
        name = shown.replace("<wbr>", "")
        path, line = href.split("#L")
        assert name.startswith("ddp_train.py:") and f":{line} " in name
        target = (rank_page.parent / path).resolve()
        assert target.is_file() and f"L{line}" in parse(target).ids


def test_the_front_page_names_where_the_traces_are(tmp_path):
    ranks = [SyntheticRank(r, 2) for r in range(2)]
    for r in ranks:
        r.op(0, 10, stack=[("/src/train.py", 3, "step", "step")])
    flat = write_run(tmp_path / "flat", ranks)            # tracer.trace(DIR): files at its top
    build(flat)
    explore = (tmp_path / "flat" / "index.html").read_text().split("<h2>Explore</h2>", 1)[1]
    assert "The traces themselves: <code>rank-R.arrow</code>" in explore
    assert (tmp_path / "flat" / "rank-0.arrow").is_file()
    # a trace-run directory, its report written elsewhere (trace-report --out)
    write_run(tmp_path / "run" / "traces", ranks)
    build(str(tmp_path / "run"), str(tmp_path / "elsewhere"))
    explore = (tmp_path / "elsewhere" / "index.html").read_text().split("<h2>Explore</h2>", 1)[1]
    assert "<code>../run/traces/rank-R.arrow</code>" in explore
