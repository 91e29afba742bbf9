"""Failures by cause, not by rank number, and stacks a person reads as their own code's: the
report's banners lead with the first failure (trace-run's run.json says which; without it, the
rank whose trace ended first), then the ranks that failed after it; a worker's traceback and a
hung rank's stacks keep the user's frames and the call into the library, never runpy's,
trace-run's or the recorder's (tracer.vocab.user_frames, the rule the recorded stacks follow)."""
from __future__ import annotations

import json
import os
import traceback

from support.constructed.synthetic import SyntheticRank, write_run
from tracer.vocab.library import LibraryRule
from tracer.vocab.outcomes import FailureKind, failure
from tracer.vocab.user_frames import PARATRACE_DIRS, trim_dump, trim_traceback
from viz.analysis import analyse
from viz.run import open_run
from viz.views.failures import by_cause
from viz.views.problems import problems

GLOO = "RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:1. GLHF!"


def failed_run(tmp_path, record=None, ends=(5.0, 2.0)):
    """Two ranks that failed: rank 1 raised, rank 0 lost its peer a moment later."""
    ranks = []
    for rank, error in ((0, GLOO), (1, "ValueError: boom")):
        r = SyntheticRank(rank, 2, meta={"error": error, "end_unix": 1000 + ends[rank]})
        r.op(0, 1)
        ranks.append(r)
    write_run(tmp_path / "traces", ranks, status="failed")
    if record is not None:
        (tmp_path / "run.json").write_text(json.dumps(record))
    return analyse(open_run(str(tmp_path)))


def titles(analysis) -> list:
    return [(p["level"], p["title"]) for p in problems(analysis)
            if p["level"] in ("failed", "followed")]


def test_the_first_failure_leads_then_the_ranks_after_it(tmp_path):
    record = {"schema": "paratrace.run/2", "world_size": 2, "first_failure": 1, "hang": None,
              "interrupted": False, "ranks": {
                  "0": {"status": "failed", "exit_code": -15, "terminated": True,
                        "failure": failure(FailureKind.ENDED, ranks=[1], cause=GLOO)},
                  "1": {"status": "failed", "exit_code": 1, "terminated": False,
                        "failure": failure(FailureKind.ERROR, cause="ValueError: boom")}}}
    assert titles(failed_run(tmp_path, record)) == [
        ("failed", "rank 1 failed first: ValueError: boom"),
        ("followed", "then rank 0 failed (after rank 1): ended by the launcher after rank 1 "
                     f"failed; its own end: {GLOO}")]


def test_without_run_json_the_rank_whose_trace_ended_first_leads(tmp_path):
    # tracer.trace's own directory: no run.json; rank 1's trace closed 3 s before rank 0's
    assert [t for _, t in titles(failed_run(tmp_path / "a"))] == [
        "rank 1 failed first: ValueError: boom", f"then rank 0 failed (after rank 1): {GLOO}"]
    assert [t for _, t in titles(failed_run(tmp_path / "b", ends=(1.0, 2.0)))][0] == \
        f"rank 0 failed first: {GLOO}"


def test_by_cause_orders_ranks():
    assert by_cause({"first_failure": 3}, [1, 3, 2]) == [3, 1, 2]
    assert by_cause({"first_failure": "3"}, ["1", "3"]) == ["3", "1"]
    assert by_cause({}, [2, 1], {1: 9.0, 2: 4.0}) == [2, 1]
    assert by_cause({"first_failure": 7}, [2, 1]) == [1, 2]      # named rank not failed


def _rule(tmp_path) -> LibraryRule:
    """tmp_path/lib and this test's own file are library, tmp_path/user the user's."""
    lib = [str(tmp_path / "lib") + os.sep, "<frozen runpy>", os.path.abspath(__file__)]
    return LibraryRule(lib, [str(tmp_path / "user") + os.sep])


def _code(path, source: str) -> dict:
    """A module's functions whose frames name ``path`` (no file needed to run them)."""
    scope: dict = {}
    exec(compile(source, str(path), "exec"), scope)
    return scope


def test_a_traceback_keeps_the_users_frames_and_the_call_into_the_library(tmp_path):
    # runpy runs the user's step, which calls c10d's all_reduce through a decorator's wrapper;
    # the recorder's wait inside it raises the peer's error
    here = os.path.join(PARATRACE_DIRS[0], "recorder", "comm.py")
    recorder = _code(here, "def wait():\n    raise RuntimeError('Connection closed by peer')\n")
    library = _code(tmp_path / "lib" / "c10d.py",
                    "def wrapper():\n    return all_reduce()\n"
                    "def all_reduce():\n    return wait()\n")
    library["wait"] = recorder["wait"]
    user = _code(tmp_path / "user" / "train.py", "def step(lib):\n    lib()\n")
    runner = _code(tmp_path / "lib" / "runpy.py", "def run(f, *a):\n    f(*a)\n")
    try:
        runner["run"](user["step"], library["wrapper"])
    except RuntimeError as exc:
        error = exc
    assert len(traceback.extract_tb(error.__traceback__)) == 6
    frames = [(f.filename, f.name) for f in traceback.extract_tb(
        trim_traceback(error, _rule(tmp_path)).__traceback__)]
    # this test's frame and runpy's outside, the wrapper and the recorder's wait inside left
    # out: the user's step and the library function it called
    assert frames == [(str(tmp_path / "user" / "train.py"), "step"),
                      (str(tmp_path / "lib" / "c10d.py"), "all_reduce")]
    assert "".join(traceback.format_exception_only(type(error), error)) == \
        "RuntimeError: Connection closed by peer\n"


def test_a_hang_dump_keeps_the_users_frames(tmp_path):
    user, lib = tmp_path / "user" / "train.py", tmp_path / "lib" / "c10d.py"
    comm = os.path.join(PARATRACE_DIRS[0], "recorder", "comm.py")
    boot = os.path.join(PARATRACE_DIRS[1], "bootstrap.py")
    dump = (f'Thread 0x00007f01 (most recent call first):\n'
            f'  File "{comm}", line 369 in wait\n'
            f'  File "{lib}", line 3252 in all_reduce\n'
            f'  File "{lib}", line 83 in wrapper\n'
            f'  File "{user}", line 70 in <module>\n'
            f'  File "<frozen runpy>", line 88 in _run_code\n'
            f'  File "{boot}", line 163 in main\n\n'
            f'Thread 0x00007f02 (most recent call first):\n'
            f'  File "{lib}", line 10 in loop\n')
    assert trim_dump(dump, _rule(tmp_path)).splitlines() == [
        "Thread 0x00007f01 (most recent call first):",
        f'  File "{lib}", line 3252 in all_reduce',
        f'  File "{user}", line 70 in <module>', "",
        "Thread 0x00007f02 (most recent call first):", f'  File "{lib}", line 10 in loop']
    assert trim_dump(dump, None) == dump
