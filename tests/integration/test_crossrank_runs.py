"""Cross-rank findings on real runs (trace-run, gloo): who is named and what, never times."""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from support import cli
from support.gpt_helpers import free_port
from support.paths import SCRIPTS, line_of


def trace_script(out: Path, nproc: int, script: str, *options: str) -> subprocess.CompletedProcess:
    """trace-run of tests/scripts/``script`` on ``nproc`` ranks."""
    return cli.trace_run("--nproc-per-node", nproc, "--master-port", free_port(), "--out", out,
                         *options, SCRIPTS / script, timeout=240)


def test_the_late_rank_is_named_the_straggler(tmp_path):
    proc = trace_script(tmp_path, 3, "crossrank_late.py")
    assert proc.returncode == 0, proc.stderr
    cross = json.loads((tmp_path / "summary.json").read_text())["cross_rank"]
    assert cross["matched"] == 4 and cross["unmatched"] == 0 and cross["mismatches"] == []
    assert cross["stragglers"][0]["rank"] == 1
    (row,) = cross["collectives"]
    assert (row["kind"], row["group"], row["count"]) == ("all_reduce", [0, 1, 2], 4)
    assert row["site"].endswith(f"crossrank_late.py:{line_of('crossrank_late.py', 'all_reduce(t)')}")


def test_a_kind_mismatch_is_named_with_both_source_lines(tmp_path):
    proc = trace_script(tmp_path, 2, "crossrank_mismatch.py", "--timeout", "8")
    assert proc.returncode == 124, proc.stderr
    reduce_line = line_of("crossrank_mismatch.py", "dist.all_reduce(t)")
    broadcast_line = line_of("crossrank_mismatch.py", "dist.broadcast(t")
    expected = (r"trace-run: mismatch: collective #2 of group \[0,1\]: ranks disagree on its "
                rf"kind: rank 0: all_reduce \(at \S+crossrank_mismatch.py:{reduce_line}\); "
                rf"rank 1: broadcast \(at \S+crossrank_mismatch.py:{broadcast_line}\)")
    assert re.search(expected, proc.stderr), proc.stderr
    # both ranks are in collective #2: the watchdog names no rank as missing, and says why
    assert ("trace-run: no rank made progress for 8s: every rank waits in a collective and none "
            "is missing from it") in proc.stderr, proc.stderr
    assert json.loads((tmp_path / "run.json").read_text())["hang"]["never_arrived"] == []
    summary = json.loads((tmp_path / "summary.json").read_text())["cross_rank"]
    (m,) = summary["mismatches"]
    assert (m["seq"], m["what"], m["group"]) == (2, "kind", [0, 1])
    html = (tmp_path / "index.html").read_text()
    first = re.search(r'<div class="banner (\w+)"><strong>(.*?)</strong>', html)
    assert first.group(1) == "mismatch" and "ranks disagree on its kind" in first.group(2)


def test_p2p_and_twin_process_groups_in_other_orders_are_no_mismatch(tmp_path):
    """Flight Recorder's numbering: per process group, collectives apart from send/recv. A send
    before a collective on one rank and after it on the other, and two groups over the same
    ranks used in opposite orders, are legal; numbered by member set alone, they read as
    'never issued it' and 'disagree on its size' (6 false mismatch lines on this script)."""
    proc = trace_script(tmp_path, 2, "crossrank_orders.py")
    assert proc.returncode == 0, proc.stderr
    assert "mismatch" not in proc.stderr, proc.stderr
    cross = json.loads((tmp_path / "summary.json").read_text())["cross_rank"]
    assert (cross["matched"], cross["unmatched"], cross["unmatched_p2p"],
            cross["mismatch_count"]) == (6, 0, 0, 0)
    rows = {row["process_group"]: row for row in cross["collectives"]}
    assert len(rows) == 3 and None in rows        # the world, and A and B by torch's names
    a, b = (name for name in rows if name is not None)
    assert [(rows[n]["group"], rows[n]["count"], rows[n]["bytes"]) for n in (None, a, b)] == \
        [([0, 1], 2, 2 * 16 * 4), ([0, 1], 2, 2 * 4 * 4), ([0, 1], 2, 2 * 64 * 4)]
    import tracer
    records = [r for r in tracer.load(str(tmp_path / "traces" / "rank-0.arrow")).records()
               if r["kind"]]
    # rank 0's sends count 0, 1 on their own; the world's all-reduces too
    assert [(r["kind"], r["seq"]) for r in records if r["group"] == (0, 1)][:2] == \
        [("send", 0), ("all_reduce", 0)]
    assert [r["seq"] for r in records if r["kind"] == "send"] == [0, 1]
    html = (tmp_path / "crossrank.html").read_text()
    assert f"(process group {a})" in html and f"(process group {b})" in html


@pytest.mark.parametrize("nproc", [2, 4])
def test_rooted_collectives_carry_the_roots_payload(tmp_path, nproc):
    """parallelize_module's scatters and broadcast, and a gather and a reduce with the root last
    to arrive and then first: cross_rank's bytes are what the script's own tensors say (the
    sizes nccl-tests gives), not what the last rank to arrive handed in (a scatter's receivers
    hand none: it read 0 B on 2 ranks)."""
    expected_file = tmp_path / "expected.json"
    proc = cli.trace_run("--nproc-per-node", nproc, "--master-port", free_port(), "--out",
                         tmp_path / "run", SCRIPTS / "crossrank_rooted.py", expected_file,
                         timeout=240)
    assert proc.returncode == 0, proc.stderr
    expected = json.loads(expected_file.read_text())
    cross = json.loads((tmp_path / "run" / "summary.json").read_text())["cross_rank"]
    assert cross["mismatch_count"] == 0 and cross["unmatched"] == 0
    world = list(range(nproc))
    got = {row["kind"]: row["bytes"] for row in cross["collectives"] if row["group"] == world}
    assert {kind: got.get(kind) for kind in expected} == expected, cross["collectives"]
