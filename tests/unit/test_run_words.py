"""run.json's facts in words (viz.views.failures, viz.views.problems), on constructed facts: each
kind of failure says what trace-run, the report and summary.json have always said, and a
run.json written before run.json held facts (a sentence in a rank's ``error``) reads as
before. The real runs: test_trace_run_faults.py, test_trace_run_exits.py, test_report.py."""
from __future__ import annotations

from types import SimpleNamespace as NS

import pytest

from instrument.supervise import run_outcome
from tracer.vocab.outcomes import Bystander, FailureKind, HangRule, failure
from viz.views.failures import (banner, failure_text, first_failure_line, reported_error,
                                watchdog_line)
from viz.views.problems import rank_error

ERROR, ENDED, EXITED, HANG = (FailureKind.ERROR, FailureKind.ENDED, FailureKind.EXITED,
                              FailureKind.HANG)
INTERRUPTED, LAUNCH = FailureKind.INTERRUPTED, FailureKind.LAUNCH
COLLECTIVE, LEFT_BEHIND, EXIT = HangRule.COLLECTIVE, HangRule.LEFT_BEHIND, HangRule.EXIT
FINISHED, WAITING = Bystander.FINISHED, Bystander.WAITING

ALL_REDUCE_8 = {"kind": "all_reduce", "group": "0,1", "seq": 8, "peer": None}
RECV = {"kind": "recv", "group": "0,1", "seq": 3, "peer": 0}


@pytest.mark.parametrize("facts, exit_code, words", [
    (failure(ERROR, cause="ValueError: boom on rank 1"), 1, "ValueError: boom on rank 1"),
    (failure(ERROR), 3, "exit code 3"),
    (failure(ENDED, ranks=[0], cause="RuntimeError: Connection closed by peer"), -15,
     "ended by the launcher after rank 0 failed; its own end: RuntimeError: Connection closed "
     "by peer"),
    (failure(ENDED, ranks=[2]), -15,
     "ended by the launcher after rank 2 failed; its own end: exit code -15"),
    (failure(EXITED, ranks=[0], cause="os._exit", site=ALL_REDUCE_8, step=2), 0,
     "exited with status 0 (os._exit) in step 2 while rank 0 waited in all_reduce #8"),
    (failure(EXITED, ranks={2, 0}, cause="sys.exit", site=ALL_REDUCE_8, step=2), 3,
     "exited with status 3 (sys.exit) in step 2 while ranks 0, 2 waited in all_reduce #8"),
    (failure(EXITED, ranks=[1], cause="os._exit", site=RECV, step=0), 0,     # no #seq: P2P
     "exited with status 0 (os._exit) in step 0 while rank 1 waited in recv"),
    (failure(HANG, ranks=[1], cause=COLLECTIVE, timeout_s=3), -15,
     "hang: ended by --timeout 3 (never arrived at the collective the others waited in)"),
    (failure(HANG, ranks=[1], cause=LEFT_BEHIND, timeout_s=2.5), -15,
     "hang: ended by --timeout 2.5 (recorded nothing after the other ranks finished)"),
    (failure(HANG, ranks=[1], cause=EXIT, timeout_s=3.0), -15,
     "hang: ended by --timeout 3 (closed its trace but did not exit)"),
    (failure(HANG, ranks=[1], cause=FINISHED, timeout_s=3), -15,
     "hang: ended by --timeout 3 (had finished, ended while exiting)"),
    (failure(HANG, ranks=[1], cause=WAITING, timeout_s=3), -15,
     "hang: ended by --timeout 3 (waiting)"),
    (failure(HANG, ranks=[1], timeout_s=3), None, "ended by the watchdog (hang)"),
    (failure(INTERRUPTED), None, "interrupted"),
    (failure(LAUNCH, cause="the rendezvous at h:1 (--rdzv-endpoint) timed out waiting for 2 "
                           "nodes to join (RendezvousTimeoutError)"), None,
     "the rendezvous at h:1 (--rdzv-endpoint) timed out waiting for 2 nodes to join "
     "(RendezvousTimeoutError)"),
    ({"kind": "from_a_later_version", "cause": "what it said"}, 1, "what it said"),
])
def test_each_failure_says_what_it_always_said(facts, exit_code, words):
    assert failure_text(facts, exit_code) == words
    record = {"ranks": {"1": {"status": "failed", "exit_code": exit_code, "failure": facts}}}
    assert reported_error(record, 1) == reported_error(record, "1") == words


def test_an_old_run_json_with_sentences_reads_as_before():
    record = {"ranks": {"0": {"status": "failed", "exit_code": -15,
                              "error": "hang: ended by --timeout 3 (waiting)"},
                        "1": {"status": "ok", "exit_code": 0, "error": None}}}
    assert reported_error(record, 0) == "hang: ended by --timeout 3 (waiting)"
    assert reported_error(record, 1) is None and reported_error(record, 7) is None
    assert reported_error({}, 0) is None
    # new files: an ok rank's failure is null
    assert reported_error({"ranks": {"0": {"status": "ok", "failure": None}}}, 0) is None


def _record(**ranks) -> dict:
    return {"hang": None, "interrupted": False, "first_failure": 1,
            "ranks": {r.lstrip("r"): info for r, info in ranks.items()}}


def test_the_first_failure_line_words_the_facts():
    exited = {"status": "failed", "exit_code": 0, "terminated": False, "failure": failure(
        EXITED, ranks=[0], cause="os._exit", site=ALL_REDUCE_8, step=2)}
    waiter = {"status": "failed", "exit_code": 1, "terminated": False,
              "failure": failure(ERROR, cause="RuntimeError: Connection closed by peer")}
    record = _record(r0=waiter, r1=exited)
    assert first_failure_line(record, {"0", "1"}) == (
        "rank 1 failed: exited with status 0 (os._exit) in step 2 while rank 0 waited in "
        "all_reduce #8; then rank(s) 0 failed too (errors in run.json)")
    assert first_failure_line(record, {"0"}) == (
        "first failure, on another node: rank 1: exited with status 0 (os._exit) in step 2 "
        "while rank 0 waited in all_reduce #8; then rank(s) 0 failed too (errors in run.json)")
    # a bystander the launcher ended is no failure of its own; a hang or Ctrl-C has its line
    ended = dict(waiter, terminated=True, failure=failure(ENDED, ranks=[1]))
    assert first_failure_line(_record(r0=ended, r1=exited), {"0", "1"}).endswith("#8")
    assert first_failure_line(dict(record, hang={}), {"0", "1"}) is None
    assert first_failure_line(dict(record, interrupted=True), {"0", "1"}) is None
    ok = {"status": "ok", "exit_code": 0, "failure": None}
    assert first_failure_line(_record(r0=ok, r1=ok), {"0", "1"}) is None


def test_the_watchdog_line_and_the_banner_word_the_hang():
    hang = {"timeout_s": 3, "exit_grace_s": 30.0, "kind": COLLECTIVE, "never_arrived": [1],
            "lingering": [], "finished": [], "ranks": {}}
    assert watchdog_line(hang) == ("no rank made progress for 3s: rank(s) 1 never arrived at "
                                   "the collective the others wait in; ending the workers")
    assert banner(hang) == "Hang: rank 1 never arrived (watchdog timeout 3 s)"
    every = dict(hang, never_arrived=[])
    assert watchdog_line(every) == (
        "no rank made progress for 3s: every rank waits in a collective and none is missing "
        "from it (ranks that disagree on a collective hang so: the report checks); ending the "
        "workers")
    assert banner(every) == \
        "Hang: every rank waited in a collective, none was missing from it (watchdog timeout 3 s)"
    behind = dict(hang, kind=LEFT_BEHIND, never_arrived=[], lingering=[1], finished=[0, 2])
    assert watchdog_line(behind) == \
        "rank(s) 1 recorded nothing for 3s after rank(s) 0, 2 finished; ending the workers"
    assert banner(behind) == \
        "Hang: rank 1 recorded nothing after the others finished (watchdog timeout 3 s)"
    stuck = dict(hang, kind=EXIT, never_arrived=[], lingering=[0, 1], finished=[0, 1])
    assert watchdog_line(stuck) == \
        "rank(s) 0, 1 closed the trace but did not exit for 30s; ending them"
    assert banner(stuck) == \
        "Hang: ranks 0, 1 closed the trace but did not exit (watchdog timeout 3 s)"


def _analysis(info: dict, ranks: dict = None, unreadable: dict = None):
    """What problems.rank_error reads of a RunAnalysis."""
    return NS(run=NS(info=info), ranks=ranks or {}, unreadable=unreadable or {})


def test_summary_json_and_the_banners_take_the_rank_error_from_the_facts():
    facts = {"ranks": {"1": {"status": "failed", "exit_code": 1,
                             "failure": failure(ERROR, cause="ValueError: boom")}}}
    traced = {1: NS(meta={"error": "ValueError: boom (from the trace)"}, status="failed")}
    assert rank_error(_analysis(facts, traced), 1) == "ValueError: boom"
    old = {"ranks": {"1": {"status": "failed", "exit_code": 1, "error": "ValueError: old"}}}
    assert rank_error(_analysis(old, traced), 1) == "ValueError: old"
    # run.json says nothing: the trace's error, an unclosed trace, an unreadable one
    assert rank_error(_analysis({}, traced), 1) == "ValueError: boom (from the trace)"
    running = {1: NS(meta={}, status="running")}
    assert rank_error(_analysis({}, running), 1) == \
        "the rank ended without closing its trace (killed?)"
    assert rank_error(_analysis({}, {}, {1: "rank-1.arrow: not a trace"}), 1) == \
        "rank-1.arrow: not a trace"


def test_trace_run_records_facts_the_words_read_back():
    """The writer's side (instrument/supervise/run_outcome.py): a failure torch reported
    without a message, the ranks the run ended before torch's agent reported them."""
    lost = run_outcome.failed_rank(0, NS(exitcode=2, message={"message": "To enable traceback"}),
                                  first=0)
    assert lost["failure"] == failure(ERROR) and reported_error({"ranks": {"0": lost}}, 0) == \
        "exit code 2"
    hang = {"timeout_s": 4, "never_arrived": [], "lingering": [3]}
    for outcome, words in ((run_outcome.Outcome(interrupted=True), "interrupted"),
                           (run_outcome.Outcome(hang=hang), "ended by the watchdog (hang)"),
                           (run_outcome.Outcome(error="RendezvousClosedError: closed"),
                            "RendezvousClosedError: closed")):
        facts = run_outcome.ended_early(outcome)
        assert facts["kind"] in (INTERRUPTED, HANG, LAUNCH)
        assert failure_text(facts) == words
    assert run_outcome.ended_early(run_outcome.Outcome(hang=hang))["ranks"] == [3]
    assert run_outcome.ended_early(run_outcome.Outcome()) is None
