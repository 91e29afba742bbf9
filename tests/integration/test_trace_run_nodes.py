"""Multi-node trace-run on localhost: two trace-runs meet in a c10d rendezvous, and the one
given ``--node-rank 0`` ends with every trace (and the report), whatever group rank torch gives
it. torch orders the nodes of a c10d rendezvous by (host, pid): on one machine the trace-run
started first gets group rank 0, which is how these tests make torch ignore ``--node-rank``."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import tracer
from support.gpt_helpers import free_port
from support.cli import C10D, ENV, comm_counts, run_json

SENT = "trace-run: traces of ranks {} sent to the collecting node ("


def start_nodes(tmp_path: Path, name: str, node_ranks: list, *script_args, report=False) -> list:
    """One trace-run per entry of ``node_ranks`` (None: no --node-rank), started in that order
    (so the first gets group rank 0); returns [(out dir, Popen)]."""
    common = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
              "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--rdzv-id", name]
    started = []
    for i, node_rank in enumerate(node_ranks):
        out = tmp_path / f"{name}-{i if node_rank is None else f'node{node_rank}'}"
        own = [] if node_rank is None else ["--node-rank", str(node_rank)]
        command = ["trace-run", *common, *own, "--out", str(out),
                   *([] if report else ["--no-report"]), C10D, *map(str, script_args)]
        started.append((out, subprocess.Popen(command, cwd=tmp_path, env=ENV, text=True,
                                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)))
    return started


def finish(started: list) -> list:
    """[(out dir, returncode, stdout, stderr)] once every trace-run has ended."""
    outputs = [proc.communicate(timeout=300) for _, proc in started]
    return [(out, proc.returncode, *output) for (out, proc), output in zip(started, outputs)]


def last_line(text: str) -> str:
    return text.strip().splitlines()[-1]


def assert_collected(collector: tuple, sender: tuple, group_rank: int) -> None:
    """``collector`` holds both ranks' traces and the run.json of both nodes; ``sender`` says
    it sent its rank there; torch gave the collector ``group_rank``."""
    (out, code, stdout, stderr), (out1, code1, stdout1, stderr1) = collector, sender
    assert code == 0 and code1 == 0, (stderr[-2000:], stderr1[-2000:])
    assert last_line(stdout) == str(out)
    sender_rank = 1 - group_rank           # one rank per node: global rank = group rank
    assert last_line(stdout1).startswith(SENT.format(sender_rank)), stdout1[-500:]
    assert last_line(stdout1).endswith(f"into {out}")
    assert "gathering traces from 1 other node" in stderr
    info = run_json(out)
    assert info["node_rank"] == group_rank and info["nnodes"] == 2
    assert info["nodes_missing"] == []
    assert info["nodes"][str(group_rank)]["ranks"] == [group_rank]
    assert info["nodes"][str(sender_rank)]["ranks"] == [sender_rank]
    assert {r: v["status"] for r, v in info["ranks"].items()} == {"0": "ok", "1": "ok"}
    for rank in (0, 1):
        assert tracer.load(str(out / "traces" / f"rank-{rank}.arrow")).status == "ok"
    assert not (out1 / "traces" / f"rank-{group_rank}.arrow").exists()


def test_two_nodes_gather_every_trace_and_the_report_where_node_rank_0_ran(tmp_path):
    # --node-rank 1 starts first, so torch makes it group rank 0 (global rank 0); rank 0
    # raises at step 1: the --node-rank 0 side must still end with both traces and the report,
    # and name the first failure although it happened on the other node
    (node1, p1), (node0, p0) = start_nodes(tmp_path, "fail", [1, 0], "--raise-on", 0,
                                           "--sleep", 0.3, report=True)
    (_, code1, out1, err1), (_, code0, out0, err0) = finish([(node1, p1), (node0, p0)])
    assert code0 != 0 and code1 != 0
    assert last_line(out0) == str(node0 / "index.html")
    assert last_line(out1).startswith(SENT.format(0)) and last_line(out1).endswith(str(node0))
    assert "trace-run: first failure, on another node: rank 0: ValueError: boom on rank 0" \
        in err0
    assert not (node1 / "index.html").exists() and not (node1 / "summary.json").exists()
    info = run_json(node0)
    assert info["node_rank"] == 1, "torch did not give group rank 0 to the first trace-run"
    assert info["nnodes"] == 2 and info["world_size"] == 2
    assert info["nodes"]["0"]["ranks"] == [0] and info["nodes"]["1"]["ranks"] == [1]
    assert info["nodes_missing"] == [] and info["first_failure"] == 0
    assert info["ranks"]["0"]["failure"] == {"kind": "error", "ranks": [], "site": None,
                                             "cause": "ValueError: boom on rank 0", "step": None}
    for rank in (0, 1):
        t = tracer.load(str(node0 / "traces" / f"rank-{rank}.arrow"))
        assert t.complete and t.status == "failed" and t.meta["node_rank"] == rank
        assert t.meta.get("clock_start") is not None and comm_counts(t)["all_reduce"] >= 4
    summary = json.loads((node0 / "summary.json").read_text())
    assert {r: v["status"] for r, v in summary["ranks"].items()} == {"0": "failed", "1": "failed"}
    assert summary["ranks"]["0"]["error"] == "ValueError: boom on rank 0"


def test_the_collector_is_the_same_over_repeated_runs(tmp_path):
    # three runs side by side: --node-rank 0 started last (torch gives it group rank 1) and
    # first (group rank 0); no --node-rank at all: both are on the rendezvous host, and the
    # lower group rank collects
    runs = {"swapped": start_nodes(tmp_path, "swapped", [1, 0], "--steps", 1),
            "in-order": start_nodes(tmp_path, "in-order", [0, 1], "--steps", 1),
            "unnamed": start_nodes(tmp_path, "unnamed", [None, None], "--steps", 1)}
    ended = {name: finish(started) for name, started in runs.items()}
    first, second = ended["swapped"]                 # --node-rank 1, then --node-rank 0
    assert_collected(second, first, group_rank=1)
    first, second = ended["in-order"]                # --node-rank 0, then --node-rank 1
    assert_collected(first, second, group_rank=0)
    first, second = ended["unnamed"]
    assert_collected(first, second, group_rank=0)
