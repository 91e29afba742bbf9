"""docs/sql.md runs as written and its answers are paratrace's own.

Every ```python block of the page runs, in order, in one namespace, on a real traced run of the
reference GPT (conftest.two_step_run: TP=2 x PP=2, 4 ranks, two steps); the page's run
directory ``"runs/tp2pp2"`` is replaced by that run's. Then each query's result, DuckDB's and
Polars', is checked: top ops per module against the report's op groups recounted over the same
steps, collectives per group and phase against summary.json's comm rows, the two-rank join
against summary.json's count of collectives the two ranks share. duckdb and polars come with
the test extras (pip install -e '.[test]'); without them the page's first block fails.
"""
from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

import pytest

from viz.analysis import analyse, recount
from viz.run import open_run
from support.paths import REPO

PAGE = REPO / "docs" / "sql.md"
PLACEHOLDER = '"runs/tp2pp2"'


@pytest.fixture(scope="module")
def run(two_step_run) -> Path:
    return two_step_run


@pytest.fixture(scope="module")
def page(run) -> dict:
    """The namespace after running every Python block of docs/sql.md on ``run``."""
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.S)
    assert len(blocks) >= 7, "docs/sql.md lost its examples"
    assert sum(b.count(PLACEHOLDER) for b in blocks) == 1
    namespace: dict = {}
    for i, block in enumerate(blocks):
        code = block.replace(PLACEHOLDER, repr(str(run)))
        exec(compile(code, f"docs/sql.md block {i + 1}", "exec"), namespace)
    return namespace


def close(ms: float, ns: float) -> bool:
    return abs(ms * 1e6 - ns) <= 1e-6 * max(abs(ns), 1.0)


def test_opening_keeps_every_event(page, run):
    import tracer
    ev = page["ev"]
    lengths = [len(tracer.load(str(p))) for p in sorted((run / "traces").glob("rank-*.arrow"))]
    assert ev.num_rows == sum(lengths) == page["df"].height
    assert "paratrace::complete" not in set(ev.column("op").to_pylist())   # folded by load


def test_top_ops_per_module_are_the_report_op_groups(page, run):
    analysis = analyse(open_run(str(run)))
    steps = frozenset(s for r in analysis.ranks.values() for s in r.steps if s > 0)
    totals = defaultdict(lambda: [0, 0.0])
    for mine in recount(analysis, steps).ranks.values():
        for g in mine.op_groups:
            if not g.kind:
                totals[(g.module, g.op)][0] += g.count
                totals[(g.module, g.op)][1] += g.time_ns
    want = defaultdict(list)
    for (module, op), (calls, ns) in totals.items():
        want[module].append((-ns, op, calls))
    rows = page["top_ops"].fetchall()
    assert {module for module, *_ in rows} == set(want)
    got = defaultdict(list)
    for module, op, calls, ms in rows:
        calls_want, ns_want = totals[(module, op)]
        assert calls == calls_want and close(ms, ns_want), (module, op)
        got[module].append(op)
    for module, ops in want.items():
        assert got[module] == [op for _, op, _ in sorted(ops)[:3]], module
    polars_rows = sorted((r["module"] or "", r["op"], r["calls"])
                         for r in page["top_ops_pl"].iter_rows(named=True))
    assert polars_rows == sorted((m or "", op, calls) for m, op, calls, _ in rows)


def test_collectives_per_group_and_phase_are_summary_json(page, run):
    summary = json.loads((run / "summary.json").read_text())
    # the trace's group text: the ranks, and torch's name of a later group over the same ranks
    want = {(int(rank), ",".join(map(str, row["group"])) + (
             f"@{row['process_group']}" if row["process_group"] else ""), row["kind"],
             row["phase"]): (row["count"], row["bytes"])
            for rank, entry in summary["ranks"].items() for row in entry["comm"]}
    assert want
    got = {(rank, group, kind, phase): (calls, nbytes)
           for rank, group, kind, phase, calls, nbytes, _ in page["comm"].fetchall()}
    assert got == want
    got_pl = {(r["rank"], r["group"], r["kind"], r["phase"]): (r["calls"], r["bytes"])
              for r in page["comm_pl"].iter_rows(named=True)}
    assert got_pl == want


def test_the_two_rank_join_pairs_every_shared_collective(page, run):
    summary = json.loads((run / "summary.json").read_text())
    shared = sum(row["count"] for row in summary["ranks"]["0"]["comm"]
                 if 1 in row["group"] and row["kind"] not in ("send", "recv"))
    rows = page["pairs"].fetchall()
    assert shared > 0 and len(rows) == shared
    assert all(row[4] == row[5] for row in rows)            # the same collective's bytes
    assert len({(row[0], row[1]) for row in rows}) == shared   # each (group, seq) once
    assert page["pairs_pl"].height == shared
    skews = sorted(row[6] for row in rows)
    assert skews == pytest.approx(sorted(page["pairs_pl"]["launch_skew_us"].to_list()),
                                  abs=1e-6)
