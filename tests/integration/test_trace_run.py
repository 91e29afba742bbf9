"""trace-run as users run it: the real command in a subprocess, real gloo workers.

Healthy runs and the command line here; faults in test_trace_run_faults.py, multi-node runs in
test_trace_run_nodes.py (all use tests/support/cli.py), pure functions in test_trace_run_units.py.
Scripts under tests/scripts/ know nothing about paratrace. Every run uses 2 ranks and a tiny
model; single-node runs need no port (trace-run lets the rendezvous pick a free one, as torchrun
--standalone does).
"""
from __future__ import annotations

import contextlib
import json
import socket
from concurrent.futures import ThreadPoolExecutor

import pytest

import tracer
from instrument.supervise import gather
from instrument.supervise.watchdog import launched_seqs, never_arrived
from support.constructed.synthetic import SyntheticRank
from support.cli import (C10D, ENV, PHASES, assert_no_traceback, comm_counts, own_lines, problems,
                         run_json, trace_run)
from support.paths import SCRIPTS


@contextlib.contextmanager
def port_held(port: int):
    """``port`` listened on, as another job on this machine would (held already: the same)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # past TIME_WAIT
        with contextlib.suppress(OSError):
            sock.bind(("", port))
            sock.listen()
        yield


def test_plain_c10d_run_records_every_rank_and_builds_the_report(tmp_path):
    out = tmp_path / "run"
    # --timeout on a healthy run: the watchdog must stay quiet. torchrun's default port is
    # held, as by a torchrun job beside it: no port given, trace-run must not need it (torch
    # before 2.13 defaults --master-port to 29500)
    with port_held(29500):
        proc = trace_run("--nproc_per_node", 2, "--out", out, "--steps", "1-", "--stack-depth",
                         4, "--timeout", 30, C10D, "--steps", 3, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert problems(proc.stderr) == []            # the watchdog stayed quiet, nothing failed
    # where it is, in order: launching, steps as the slowest rank advances, the report
    lines = own_lines(proc.stderr)
    assert lines[0] == "launching 2 ranks (trace_run_c10d.py --steps 3)"
    steps = [int(line.split()[1].split("/")[0]) for line in lines if line.startswith(PHASES[1])]
    assert steps == sorted(set(steps)) and steps[0] >= 1 and steps[-1] == 3  # steps completed
    assert lines[-1] == "building the report" and len(lines) == 2 + len(steps)
    # the script got its own argv (--steps 3: three loss lines per rank) and ran as __main__
    assert proc.stdout.count("step 2 loss") == 2
    assert proc.stdout.strip().splitlines()[-1] == str(out / "index.html")
    assert (out / "index.html").is_file()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["world_size"] == 2
    assert {r: v["status"] for r, v in summary["ranks"].items()} == {"0": "ok", "1": "ok"}
    info = run_json(out)
    assert info["schema"] == "paratrace.run/2" and info["exit_code"] == 0
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


BAD_INPUTS = [
    (["--bogus-option", C10D], "unrecognized arguments: --bogus-option"),
    (["no_such_script.py"], "script not found: no_such_script.py"),
    (["--out", "/proc/cannot-write-here", C10D], "cannot write to --out"),
    (["--steps", "3-1", C10D], "--steps: bad step selection"),
    # refused before torch's launcher prints its OMP_NUM_THREADS banner (2 processes)
    (["--nproc-per-node", "2", "--out", "", C10D], "--out must name a directory (got '')"),
    # values torch's agent only rejects once launched (an empty AssertionError, a traceback, a
    # rendezvous that never completes): refused first, naming the option
    (["--nproc-per-node", "0", C10D], "--nproc-per-node must be a number of processes of at "
                                      "least 1, or one of cpu, gpu, xpu, auto (got '0')"),
    (["--nnodes", "x", C10D], "--nnodes must be N or MIN:MAX with 0 < MIN <= MAX (got 'x')"),
    (["--monitor-interval", "0", C10D], "--monitor-interval must be a positive number"),
    (["--rdzv-backend", "bogus", C10D], "--rdzv-backend must be one of c10d, "),
    (["--nnodes", "2", "--node-rank", "5", "--master-port", "29999", C10D],
     "--node-rank must be between 0 and 1 for --nnodes 2 (got 5)"),
    # the reference GPT told to use more GPUs than the machine has (the tests see none)
    (["--nproc-per-node", "2", "-m", "sample_runs.train", "--device", "cuda"],
     "--device cuda needs one GPU per local rank: 2 ranks on this node, 0 GPUs; run fewer "
     "ranks per node or --device cpu"),
]


@pytest.fixture(scope="module")
def refusals(tmp_path_factory) -> dict:
    """Each bad input's trace-run, in a directory of its own, all started at once: each is a
    process that imports torch (about 2 s of CPU), and none waits on another."""
    # without OMP_NUM_THREADS, torch's launcher prints a banner for 2+ processes: none may
    # come before a refusal (nothing is launched here)
    env = {k: v for k, v in ENV.items() if k != "OMP_NUM_THREADS"}

    def refuse(args: list, cwd) -> tuple:
        return trace_run(*args, cwd=cwd, timeout=240, env=env), cwd

    cwds = [tmp_path_factory.mktemp("refused") for _ in BAD_INPUTS]
    with ThreadPoolExecutor(len(BAD_INPUTS)) as pool:
        done = pool.map(refuse, [args for args, _ in BAD_INPUTS], cwds)
        return {tuple(map(str, args)): result for (args, _), result in zip(BAD_INPUTS, done)}


@pytest.mark.parametrize("args, message", BAD_INPUTS)
def test_bad_input_is_one_line_and_exit_2(refusals, args, message):
    proc, cwd = refusals[tuple(map(str, args))]
    assert proc.returncode == 2
    assert_no_traceback(proc)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("trace-run: error: ") and message in lines[0]
    assert not (cwd / "traces").exists()


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
    # a send's sequence number counts sends and receives, not collectives: rank 1's last
    # operation, send #3, says nothing about collective #3 of the group
    mine = {"kind": "all_reduce", "group": "0,1", "seq": 3, "peer": None}
    sent = {"kind": "send", "group": "0,1", "seq": 3, "peer": 0}
    assert never_arrived({0: {"inflight": [mine]}, 1: {"inflight": [], "last_collective": sent}},
                         {1: {"0,1": 2}}) == [1]
    # a later process group over the same ranks is a group of its own (0,1@2)
    twin = dict(mine, group="0,1@2", seq=0)
    assert never_arrived({0: {"inflight": [twin]}, 1: {"inflight": [], "last_collective": mine}},
                         {1: {"0,1": 3}}) == [1]


def test_launched_seqs_counts_collectives_not_sends(tmp_path):
    r = SyntheticRank(0, 2)
    for i in range(5):
        r.comm("send", 10 * i, 10 * i + 1, 10 * i + 2, peer=1, group=(0, 1))
    r.comm("all_reduce", 60, 61, 62, group=(0, 1))
    r.comm("all_reduce", 70, 71, 72, group="0,1@2")
    r.comm("all_reduce", 80, 81, 82, group="0,1@2")
    r.write(tmp_path)
    assert launched_seqs(str(tmp_path), 0) == {"0,1": 0, "0,1@2": 1}


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
        assert collector.wait(1, timeout=120)      # it has arrived: the bound ends a hang
    finally:
        collector.stop()
    assert where == str(tmp_path / "node0")
    received = tmp_path / "node0" / "traces"
    assert sorted(p.name for p in received.iterdir()) == ["rank-1.arrow", "rank-1.status.json"]
    assert (received / "rank-1.arrow").read_bytes() == (sent / "rank-1.arrow").read_bytes()
    assert collector.uploads[1].ranks == {"1": {"status": "ok"}}


def test_no_script_means_the_reference_gpt_on_its_default_world_size():
    from instrument.launch.command_line import build_parser, resolve_target, worker_args
    import sample_runs.train

    args = build_parser().parse_args(["--out", "x"])
    target = resolve_target(args)
    assert (target.script, target.module, target.args) == (None, "sample_runs.train", [])
    assert args.nproc_per_node == str(sample_runs.train.DEFAULT_WORLD_SIZE)
    argv = worker_args(args, "/abs/x", target)
    assert argv[:3] == ["-u", "-m", "instrument.launch.bootstrap"]
    assert argv[argv.index("--"):] == ["--", "-m", "sample_runs.train"]
    # an explicit --nproc-per-node wins, in either spelling
    args = build_parser().parse_args(["--nproc_per_node", "2"])
    resolve_target(args)
    assert args.nproc_per_node == "2"
    # a script's own options after SCRIPT are its own, even when they look like ours
    args = build_parser().parse_args(["--steps", "1", C10D, "--steps", "5", "--out", "y"])
    assert args.steps == "1" and args.out is None
    assert resolve_target(args).args == ["--steps", "5", "--out", "y"]
