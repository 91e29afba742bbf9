"""trace-run as users run it: the real command in a subprocess, real gloo workers, real faults.

Scripts under tests/scripts/ know nothing about paratrace. Every run uses 2 ranks and a tiny
model; single-node runs need no port (trace-run lets the rendezvous pick one, as torchrun does).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

import tracer
from instrument import gather
from instrument.watchdog import never_arrived
from gpt_helpers import free_port

SCRIPTS = Path(__file__).parent / "scripts"
C10D = str(SCRIPTS / "trace_run_c10d.py")
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")


def trace_run(*args, cwd, timeout=180) -> subprocess.CompletedProcess:
    return subprocess.run(["trace-run", *map(str, args)], cwd=cwd, env=ENV, text=True,
                          capture_output=True, timeout=timeout)


def run_json(out: Path) -> dict:
    return json.loads((out / "run.json").read_text())


def comm_counts(trace) -> dict:
    counts: dict = {}
    for rec in trace.records():
        if rec["kind"]:
            counts[rec["kind"]] = counts.get(rec["kind"], 0) + 1
    return counts


def assert_no_traceback(proc: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]




def test_plain_c10d_run_records_every_rank_and_builds_the_report(tmp_path):
    out = tmp_path / "run"
    # --timeout on a healthy run: the watchdog must stay quiet
    proc = trace_run("--nproc_per_node", 2, "--out", out, "--steps", "1-", "--stack-depth", 4,
                     "--timeout", 30, C10D, "--steps", 3, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "no rank made progress" not in proc.stderr
    # the script got its own argv (--steps 3: three loss lines per rank) and ran as __main__
    assert proc.stdout.count("step 2 loss") == 2
    assert proc.stdout.strip().splitlines()[-1] == str(out / "index.html")
    assert (out / "index.html").is_file()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2
    assert {r: v["status"] for r, v in summary["ranks"].items()} == {"0": "ok", "1": "ok"}
    info = run_json(out)
    assert info["schema"] == "paratrace.run/1" and info["exit_code"] == 0
    assert info["target"] == {"script": C10D, "module": None, "args": ["--steps", "3"]}
    for rank in (0, 1):
        t = tracer.load(str(out / "traces" / f"rank-{rank}.arrow"))
        assert t.status == "ok" and t.complete and t.rank == rank and t.world_size == 2
        assert t.meta["options"]["steps"] == "1-" and t.meta["options"]["stack_depth"] == 4
        steps = set(t.col("step").tolist())
        assert steps and min(steps) >= 1            # --steps 1-: step 0 not recorded
        # 4 parameters all-reduced per step, steps 1 and 2 recorded
        assert comm_counts(t)["all_reduce"] >= 8
        assert all(len(t.stack(c)) <= 4 for c in set(t.col("stack").tolist()) if c >= 0)


def test_dtensor_tensor_parallel_script_runs_unchanged(tmp_path):
    out = tmp_path / "tp"
    proc = trace_run("--nproc-per-node", 2, "--out", out, "--no-report",
                     "--include-library-frames", SCRIPTS / "trace_run_dtensor_tp.py", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == str(out)
    for rank in (0, 1):
        t = tracer.load(str(out / "traces" / f"rank-{rank}.arrow"))
        assert t.status == "ok"
        ops = set(t.dictionary("op"))
        # RowwiseParallel's forward all-reduce, through functional collectives
        assert "_c10d_functional.all_reduce.default" in ops
        assert comm_counts(t)["all_reduce"] >= 2
        # library frames kept: DTensor's own files appear in the stacks
        assert t.meta["options"]["library_frames"] is True
        files = {frame[0] for c in set(t.col("stack").tolist()) if c >= 0 for frame in t.stack(c)}
        assert any("torch/distributed/tensor" in f for f in files)


def test_torch_pipelining_script_runs_unchanged(tmp_path):
    out = tmp_path / "pp"
    proc = trace_run("--nproc-per-node", 2, "--out", out, "--no-report",
                     SCRIPTS / "trace_run_pipelining.py", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    stage0 = tracer.load(str(out / "traces" / "rank-0.arrow"))
    stage1 = tracer.load(str(out / "traces" / "rank-1.arrow"))
    # 4 micro-batches x 2 steps: activations go 0 -> 1, gradients come back 1 -> 0
    for t, peer in ((stage0, 1), (stage1, 0)):
        p2p = [r for r in t.records() if r["kind"] in ("send", "recv")]
        assert sum(r["kind"] == "send" for r in p2p) >= 8
        assert sum(r["kind"] == "recv" for r in p2p) >= 8
        assert {r["peer"] for r in p2p} == {peer}


def test_a_rank_that_raises_is_marked_failed_and_the_others_stay_readable(tmp_path):
    out = tmp_path / "raise"
    proc = trace_run("--nproc-per-node", 2, "--out", out, C10D, "--raise-on", 1,
                     "--sleep", 0.3, cwd=tmp_path)
    assert proc.returncode != 0
    assert "trace-run: rank 1 failed: ValueError: boom on rank 1" in proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == str(out / "index.html")
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ranks"]["1"]["status"] == "failed"
    info = run_json(out)
    assert info["first_failure"] == 1
    assert info["ranks"]["1"]["error"] == "ValueError: boom on rank 1"
    assert info["ranks"]["1"]["last_collective"]["kind"] == "all_reduce"
    assert info["ranks"]["0"]["terminated"] is True
    failed = tracer.load(str(out / "traces" / "rank-1.arrow"))
    assert failed.status == "failed" and "boom on rank 1" in failed.meta["error"]
    other = tracer.load(str(out / "traces" / "rank-0.arrow"))
    assert other.complete and comm_counts(other)["all_reduce"] >= 4


def test_a_rank_killed_with_sigkill(tmp_path):
    out = tmp_path / "kill"
    proc = trace_run("--nproc-per-node", 2, "--out", out, "--no-report", C10D, "--kill", 0,
                     "--sleep", 0.4, cwd=tmp_path)
    assert proc.returncode == 128 + signal.SIGKILL
    info = run_json(out)
    assert info["first_failure"] == 0 and info["exit_code"] == 128 + signal.SIGKILL
    assert info["ranks"]["0"]["status"] == "failed"
    assert "SIGKILL" in info["ranks"]["0"]["error"]
    killed = tracer.load(str(out / "traces" / "rank-0.arrow"))
    # never closed, but everything flushed before the kill (step 0 and its all-reduces) is there
    assert not killed.complete and killed.status != "ok"
    assert comm_counts(killed)["all_reduce"] >= 4
    survivor = tracer.load(str(out / "traces" / "rank-1.arrow"))
    assert survivor.complete and survivor.status in ("failed", "interrupted")


def script_line(script, text: str) -> int:
    """The line number of ``text`` in a test script (so edits above it don't break tests)."""
    lines = Path(script).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)


def test_a_hang_under_timeout_names_the_rank_that_never_arrived(tmp_path):
    out = tmp_path / "hang"
    proc = trace_run("--nproc-per-node", 2, "--out", out, "--no-report", "--timeout", 3, C10D,
                     "--hang", 1, "--sleep", 0.3, cwd=tmp_path)
    assert proc.returncode == 124
    ours = [line for line in proc.stderr.splitlines() if line.startswith("trace-run:")]
    assert "rank(s) 1 never arrived" in ours[0]
    hang = run_json(out)["hang"]
    assert hang["timeout_s"] == 3 and hang["never_arrived"] == [1]
    waiting = hang["ranks"]["0"]
    assert [(c["kind"], c["group"]) for c in waiting["inflight"]] == [("all_reduce", "0,1")]
    assert waiting["inflight"][0]["seq"] > hang["ranks"]["1"]["last_collective"]["seq"]
    # the Python stacks dumped at the hang: rank 0 in its all_reduce, rank 1 in its sleep
    assert f'trace_run_c10d.py", line {script_line(C10D, "dist.all_reduce(p.grad)")}' \
        in waiting["stack"]
    assert f'trace_run_c10d.py", line {script_line(C10D, "time.sleep(3600)")}' \
        in hang["ranks"]["1"]["stack"]
    # rank 0 was ended while waiting: its trace keeps the all-reduce in flight (never completed)
    waiter = tracer.load(str(out / "traces" / "rank-0.arrow"))
    stuck = [r for r in waiter.records() if r["seq"] == waiting["inflight"][0]["seq"]
             and r["kind"] == "all_reduce"]
    assert len(stuck) == 1 and stuck[0]["t1"] is None
    assert tracer.load(str(out / "traces" / "rank-1.arrow")).table.num_rows > 0


def test_sigint_mid_run_flushes_traces_and_builds_the_report(tmp_path):
    out, log = tmp_path / "int", tmp_path / "stdout.txt"
    with open(log, "w") as stdout:
        proc = subprocess.Popen(["trace-run", "--nproc-per-node", "2", "--out", str(out), C10D,
                                 "--steps", "200", "--sleep", "0.2"], cwd=tmp_path, env=ENV,
                                stdout=stdout, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while "step 2 loss" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGINT, stderr[-3000:]
    assert log.read_text().strip().splitlines()[-1] == str(out / "index.html")
    info = run_json(out)
    assert info["interrupted"] is True
    for rank in (0, 1):
        t = tracer.load(str(out / "traces" / f"rank-{rank}.arrow"))
        assert t.complete and t.status == "interrupted"
        assert comm_counts(t)["all_reduce"] >= 8
    assert (out / "summary.json").is_file()


def test_two_nodes_on_localhost_gather_every_trace_on_node_0(tmp_path):
    # rank 1 (node 1) raises at step 1: node 0 must still end with both traces, and name it
    port = free_port()
    common = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
              "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "two-nodes"]
    procs = []
    for node in (0, 1):
        procs.append(subprocess.Popen(
            ["trace-run", *common, "--node-rank", str(node), "--out", str(tmp_path / f"n{node}"),
             C10D, "--raise-on", "1", "--sleep", "0.3"], cwd=tmp_path, env=ENV, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE))
        time.sleep(0.5)    # node 0's agent first, so it gets group rank 0 (c10d orders by pid)
    results = [p.communicate(timeout=180) for p in procs]
    assert procs[0].returncode != 0 and procs[1].returncode != 0
    node0 = tmp_path / "n0"
    assert results[0][0].strip().splitlines()[-1] == str(node0 / "index.html")
    last1 = results[1][0].strip().splitlines()[-1]
    assert last1.startswith("trace-run: node 1: traces of ranks 1 sent to node 0") \
        and last1.endswith(str(node0))
    assert "first failure, on another node: rank 1: ValueError: boom on rank 1" in results[0][1]
    info = run_json(node0)
    assert info["nnodes"] == 2 and info["world_size"] == 2
    assert info["nodes"]["0"]["ranks"] == [0] and info["nodes"]["1"]["ranks"] == [1]
    assert info["nodes_missing"] == [] and info["first_failure"] == 1
    assert info["ranks"]["1"]["error"] == "ValueError: boom on rank 1"
    for rank in (0, 1):
        t = tracer.load(str(node0 / "traces" / f"rank-{rank}.arrow"))
        assert t.complete and t.status == "failed" and t.meta["node_rank"] == rank
        assert t.meta.get("clock_start") is not None and comm_counts(t)["all_reduce"] >= 4
    summary = json.loads((node0 / "summary.json").read_text())
    assert {r: v["status"] for r, v in summary["ranks"].items()} == {"0": "failed", "1": "failed"}


@pytest.mark.parametrize("args, message", [
    (["--bogus-option", C10D], "unrecognized arguments: --bogus-option"),
    (["no_such_script.py"], "script not found: no_such_script.py"),
    (["--out", "/proc/cannot-write-here", C10D], "cannot write to --out"),
    (["--steps", "3-1", C10D], "--steps: bad step selection"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, message):
    proc = trace_run(*args, cwd=tmp_path, timeout=60)
    assert proc.returncode == 2
    assert_no_traceback(proc)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("trace-run: error: ") and message in lines[0]
    assert not (tmp_path / "traces").exists()


def test_help_shows_torchrun_and_trace_run_options(tmp_path):
    proc = trace_run("--help", cwd=tmp_path, timeout=60)
    assert proc.returncode == 0
    for option in ("--nproc-per-node", "--nproc_per_node", "--rdzv-endpoint", "--max-restarts",
                   "--out DIR", "--steps SPEC", "--stack-depth", "--include-library-frames",
                   "--no-report", "--timeout SECONDS"):
        assert option in proc.stdout, option


def test_never_arrived_compares_sequence_numbers_per_group():
    stuck = {"kind": "all_reduce", "group": "0,1,2,3", "seq": 7, "peer": None}
    statuses = {
        0: {"inflight": [stuck], "last_collective": stuck},
        1: {"inflight": [stuck], "last_collective": stuck},
        # rank 2 launched seq 7 long ago on this group, then moved on to another group
        2: {"inflight": [], "last_collective": {"kind": "all_reduce", "group": [2, 3], "seq": 1}},
        3: {"inflight": [], "last_collective": {"kind": "all_reduce", "group": [0, 1, 2, 3],
                                                "seq": 6}},
    }
    assert never_arrived(statuses, {2: {"0,1,2,3": 7}}) == [3]
    # without the trace, rank 2's history on the group is unknown: it is suspected too
    assert never_arrived(statuses, {}) == [2, 3]
    # P2P: rank 0 sends to 1, which never posted the receive; rank 4 has no status at all
    send = {"kind": "send", "group": "0,1", "seq": 0, "peer": 1}
    assert never_arrived({0: {"inflight": [send]}, 1: {"inflight": []}}, {}) == [1]
    assert never_arrived({0: {"inflight": [dict(stuck, group="0,4")]}}, {}) == [4]
    # multi-node: ranks of other nodes are out of sight, not suspects
    assert never_arrived({0: {"inflight": [dict(stuck, group="0,4")]}}, {}, True) == []


def test_collector_takes_only_this_runs_token_and_rank_file_names(tmp_path):
    sent = tmp_path / "node1"
    sent.mkdir()
    (sent / "rank-1.arrow").write_bytes(b"\x00trace bytes" * 1000)
    (sent / "rank-1.status.json").write_text("{}")
    (sent / "notes.txt").write_text("not a trace file: stays home")
    collector = gather.Collector(str(tmp_path / "node0" / "traces"), "127.0.0.1")
    address = collector.start()
    try:
        with pytest.raises(gather.GatherError, match="wrong token"):
            gather.send(address.partition("#")[0] + "#forged", str(sent), 1, {})
        where = gather.send(address, str(sent), 1, {"1": {"status": "ok"}})
        assert collector.wait(1, timeout=10)
    finally:
        collector.stop()
    assert where == str(tmp_path / "node0")
    received = tmp_path / "node0" / "traces"
    assert sorted(p.name for p in received.iterdir()) == ["rank-1.arrow", "rank-1.status.json"]
    assert (received / "rank-1.arrow").read_bytes() == (sent / "rank-1.arrow").read_bytes()
    assert collector.uploads[1].ranks == {"1": {"status": "ok"}}


def test_no_script_means_the_reference_gpt_on_its_default_world_size():
    from instrument.cli import build_parser, resolve_target, worker_args
    import sample_runs.train

    args = build_parser().parse_args(["--out", "x"])
    target = resolve_target(args)
    assert (target.script, target.module, target.args) == (None, "sample_runs.train", [])
    assert args.nproc_per_node == str(sample_runs.train.DEFAULT_WORLD_SIZE)
    argv = worker_args(args, "/abs/x", target)
    assert argv[:3] == ["-u", "-m", "instrument.bootstrap"]
    assert argv[argv.index("--"):] == ["--", "-m", "sample_runs.train"]
    # an explicit --nproc-per-node wins, in either spelling
    args = build_parser().parse_args(["--nproc_per_node", "2"])
    resolve_target(args)
    assert args.nproc_per_node == "2"
    # a script's own options after SCRIPT are its own, even when they look like ours
    args = build_parser().parse_args(["--steps", "1", C10D, "--steps", "5", "--out", "y"])
    assert args.steps == "1" and args.out is None
    assert resolve_target(args).args == ["--steps", "5", "--out", "y"]
