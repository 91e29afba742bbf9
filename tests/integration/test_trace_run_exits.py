"""How ranks and trace-run leave, run for real (tests/scripts/trace_run_exits.py, 2 ranks): a
rank that leaves with os._exit or sys.exit mid-step, one --out for two runs, SIGKILL to
trace-run and the processes a script forks; plus the first-failure rules on constructed files.

| case                                            | exit | what is checked                         |
|-------------------------------------------------|------|-----------------------------------------|
| rank 1 os._exit(0) in step 2, a forked child each | 1  | its rows kept, blamed, children ended   |
| rank 1 sys.exit(3) in step 2                    | 3    | blamed with its status                  |
| a second trace-run / trace-report on a live run | 2    | one line each                           |
| SIGKILL to trace-run, ranks deaf to SIGTERM     |      | workers, children gone; traces closed   |
"""
from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys

import pytest

import tracer
from instrument.supervise import run_outcome
from tracer.files import rundir
from support.constructed.synthetic import SyntheticRank
from support.cli import ENV, own_lines, problems, run_json, trace_run
from support.waiting import alive, wait_until
from support.paths import SCRIPTS
from viz.views.failures import failure_text

EXITS = str(SCRIPTS / "trace_run_exits.py")
PARAMS = 4                 # the script's model: 2 Linear layers, weight and bias each
STEPS_DONE = 2             # the exiting rank leaves in step 2, after steps 0 and 1


def _pids(marker) -> list:
    """Each rank's pid and its forked child's, from the script's marker files."""
    out = []
    for rank in (0, 1):
        found = json.loads((marker / f"rank-{rank}.json").read_text())
        out += [found["pid"]] + ([found["child"]] if found["child"] else [])
    return out


def test_a_rank_leaving_with_os_exit_mid_step_keeps_its_rows_and_is_blamed(tmp_path):
    out, marker = tmp_path / "run", tmp_path / "marker"
    marker.mkdir()
    proc = trace_run("--nproc-per-node", 2, "--out", out, EXITS, "--exit", 1, "--how", "os",
                     "--code", 0, "--fork", "--marker", marker, cwd=tmp_path)
    # the collective rank 0 waited in: the first of step 2 (sequence numbers count from 0)
    waited = STEPS_DONE * PARAMS
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert problems(proc.stderr)[0] == (
        f"rank 1 failed: exited with status 0 (os._exit) in step 2 while rank 0 waited in "
        f"all_reduce #{waited}; then rank(s) 0 failed too (errors in run.json)")
    info = run_json(out)
    assert (info["first_failure"], info["exit_code"]) == (1, 1)
    assert info["ranks"]["1"]["status"] == "failed" and info["ranks"]["1"]["exit_code"] == 0
    left = tracer.load(str(out / "traces" / "rank-1.arrow"))
    # closed by the exit: every row of its finished steps and of step 2 up to the exit
    assert left.complete and left.status == "ok"
    assert left.meta["exit"] == {"how": "os._exit", "code": 0, "step": 2}
    seqs = sorted(r["seq"] for r in left.records() if r["kind"] == "all_reduce")
    assert seqs == list(range(waited))
    assert {r["step"] for r in left.records() if r["op"] == "aten.mm.default"} == {0, 1, 2}
    waiter = tracer.load(str(out / "traces" / "rank-0.arrow"))
    assert [c["seq"] for c in waiter.meta["failed_collectives"]] == [waited]
    # what each rank forked ended with it (SIGKILL: the children ignore SIGTERM)
    assert not [pid for pid in _pids(marker) if alive(pid)]
    # the recorder hashed the script; the report shows it, saying where it was found
    digest = hashlib.sha256(open(EXITS, "rb").read()).hexdigest()
    assert left.meta["sources"][EXITS]["sha256"] == digest
    assert left.meta["sources"][EXITS]["root"] == "script"
    page = (out / "source" / "trace_run_exits.py.html").read_text()
    assert f"under the script&#39;s directory {SCRIPTS}, as trace_run_exits.py" in page
    assert f"sha256 <code>{digest[:12]}</code>" in page and "def fork_child" in page


def test_a_rank_leaving_with_sys_exit_is_blamed_with_its_status(tmp_path):
    out = tmp_path / "run"
    proc = trace_run("--nproc-per-node", 2, "--out", out, "--no-report", EXITS, "--exit", 1,
                     "--how", "sys", "--code", 3, cwd=tmp_path)
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert problems(proc.stderr) == [
        f"rank 1 failed: exited with status 3 (sys.exit) in step 2 while rank 0 waited in "
        f"all_reduce #{STEPS_DONE * PARAMS}"]
    left = tracer.load(str(out / "traces" / "rank-1.arrow"))
    assert left.status == "failed" and left.meta["exit"] == {"how": "sys.exit", "code": 3,
                                                              "step": 2}


def test_one_run_per_out_and_no_orphans_after_sigkill(tmp_path):
    """A run that trains until it is ended, every rank ignoring SIGTERM and each with a forked
    child that ignores it too: a second trace-run and a trace-report into its directory are
    refused while it runs; after SIGKILL to trace-run everything it started ends (plain
    torchrun leaves all 4 running: docs/trace-run.md) and the traces are closed."""
    out, marker = tmp_path / "run", tmp_path / "marker"
    marker.mkdir()
    with open(tmp_path / "stderr.txt", "w") as stderr:
        first = subprocess.Popen(
            ["trace-run", "--nproc-per-node", "2", "--out", str(out), EXITS, "--steps", "0",
             "--fork", "--deaf", "--marker", str(marker)], cwd=tmp_path, env=ENV,
            stdout=subprocess.DEVNULL, stderr=stderr)
        try:
            wait_until(lambda: all((marker / f"rank-{r}.json").exists() for r in (0, 1)),
                       "both ranks past step 0")
            second = trace_run("--nproc-per-node", 2, "--out", out, EXITS, cwd=tmp_path)
            report = subprocess.run(["trace-report", str(out)], env=ENV, text=True,
                                    capture_output=True, timeout=120)
        finally:
            first.send_signal(signal.SIGKILL)
            first.wait()
    assert second.returncode == 2
    assert own_lines(second.stderr) == [f"error: --out {out} already holds traces of another "
                                        "run; choose a new DIR"]
    assert report.returncode == 2
    assert report.stderr == (f"trace-report: error: {out} is still being written by trace-run "
                             f"(pid {first.pid}); run trace-report when it has ended, or write "
                             "elsewhere with --out DIR\n")
    pids = _pids(marker)
    # within the 3 s grace on an idle machine; the bound only ends a hung test
    wait_until(lambda: not any(alive(pid) for pid in pids), "workers and children ended")
    for rank in (0, 1):
        t = tracer.load(str(out / "traces" / f"rank-{rank}.arrow"))
        assert t.complete and t.status == "interrupted", t.meta.get("error")
        assert t.meta["error"] == ("trace-run ended (killed?) and the worker did not stop on "
                                   "SIGTERM within 3s")
    # the lock died with its holder: the run's directory can be reported now
    assert rundir.run_writer(str(out)) is None
    done = subprocess.run(["trace-report", str(out)], env=ENV, text=True, capture_output=True,
                          timeout=240)
    assert done.returncode == 0, done.stderr


def test_a_held_lock_refuses_trace_run_and_trace_report(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    lock = rundir.lock_run(str(out))
    try:
        proc = trace_run("--nproc-per-node", 2, "--out", out, EXITS, cwd=tmp_path, timeout=120)
        report = subprocess.run(["trace-report", str(tmp_path / "elsewhere"), "--out", str(out)],
                                env=ENV, text=True, capture_output=True, timeout=120)
    finally:
        os.close(lock)
    assert proc.returncode == 2
    assert own_lines(proc.stderr) == [f"error: --out {out} is being written by another "
                                      f"trace-run (pid {os.getpid()}); choose a new DIR"]
    assert not (out / "traces" / "rank-0.arrow").exists()
    assert report.returncode == 2 and f"{out} is still being written by trace-run " \
        f"(pid {os.getpid()})" in report.stderr


def _status(traces, rank: int, **values) -> None:
    (traces / f"rank-{rank}.status.json").write_text(json.dumps(values))


def test_the_first_failure_goes_by_the_status_files_own_clock(tmp_path):
    """Modification times tie within the kernel's clock tick; the time a rank wrote into its
    status file does not: rank 0, killed, wrote last before rank 1 saw it die."""
    for rank, now_ns in ((0, 1_000), (1, 2_000)):
        _status(tmp_path, rank, now_ns=now_ns)
        os.utime(tmp_path / f"rank-{rank}.status.json", (100.0, 100.0))
    assert run_outcome.first_to_stop([1, 0], str(tmp_path)) == 0
    _status(tmp_path, 0, now_ns=3_000)
    assert run_outcome.first_to_stop([0, 1], str(tmp_path)) == 1


@pytest.mark.parametrize("launched, blamed", [(7, True), (8, False)])
def test_a_rank_that_exited_is_blamed_only_if_a_failed_rank_waited_for_it(tmp_path, launched,
                                                                          blamed):
    """Rank 1 left with os._exit(0); rank 0 failed in all_reduce #8 of group 0,1. Rank 1 is the
    cause if it never launched #8 (it left while rank 0 waited), not if it had."""
    r = SyntheticRank(1, 2, meta={"exit": {"how": "os._exit", "code": 0, "step": 2}})
    for seq in range(launched + 1):
        r.comm("all_reduce", 10 * seq, 10 * seq + 1, 10 * seq + 5, group=(0, 1), nbytes=16)
    r.write(tmp_path)
    failed = {"kind": "all_reduce", "group": "0,1", "seq": 8, "peer": None, "error": "reset"}
    _status(tmp_path, 0, final=True, failed_collectives=[failed], inflight=[])
    _status(tmp_path, 1, final=True, failed_collectives=[], inflight=[])
    statuses = {0: json.loads((tmp_path / "rank-0.status.json").read_text()),
                1: json.loads((tmp_path / "rank-1.status.json").read_text())}
    left = run_outcome.left_early(str(tmp_path), statuses, {0})
    if not blamed:
        assert left == {}
        return
    site = {"kind": "all_reduce", "group": "0,1", "seq": 8, "peer": None}
    assert left == {1: {"code": 0, "failure": {"kind": "exited", "ranks": [0], "site": site,
                                               "cause": "os._exit", "step": 2}}}
    assert failure_text(left[1]["failure"], left[1]["code"]) == \
        "exited with status 0 (os._exit) in step 2 while rank 0 waited in all_reduce #8"


FORKED_EXIT = """
import os, sys, torch, tracer
with tracer.trace(sys.argv[1]):
    torch.ones(4).add(1)
    pid = os.fork()
    if pid == 0:                    # a forked child leaves as multiprocessing's workers do,
        torch.ones(4).mul(2)        # or by sys.exit, unwinding through the trace's __exit__
        os._exit(0) if sys.argv[3] == "os._exit" else sys.exit(0)
    os.waitpid(pid, 0)
    torch.ones(4).sub(1)
    if sys.argv[2] == "exit":
        os._exit(3)
"""


@pytest.mark.parametrize("how,child", [("exit", "os._exit"), ("return", "os._exit"),
                                       ("return", "sys.exit")])
def test_os_exit_closes_the_trace_but_never_from_a_forked_child(tmp_path, how, child):
    script = tmp_path / "forked.py"
    script.write_text(FORKED_EXIT)
    env = {k: v for k, v in ENV.items() if k not in ("RANK", "WORLD_SIZE")}
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "t"), how, child], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == (3 if how == "exit" else 0), proc.stderr[-3000:]
    t = tracer.load(str(tmp_path / "t" / "rank-0.arrow"))
    assert t.complete and not t.warnings
    ops = [r["op"] for r in t.records() if r["op"].startswith("aten.")]
    # the child's mul is in no trace: its copy of the session wrote nothing
    assert [op.split(".")[1] for op in ops if "ones" not in op] == ["add", "sub"]
    if how == "exit":
        assert (t.status, t.meta["error"]) == ("failed", "os._exit(3)")
        assert t.meta["exit"] == {"how": "os._exit", "code": 3, "step": 0}
    else:
        assert t.status == "ok" and "exit" not in t.meta
