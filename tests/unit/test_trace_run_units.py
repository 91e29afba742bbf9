"""trace-run's pure parts: the hang rules, step progress lines, the choice of the collecting
node, option checks, the run record. Fake clocks and status dicts; the real runs are in
test_trace_run.py, test_trace_run_faults.py and test_trace_run_nodes.py."""
from __future__ import annotations

import os

import pytest

from instrument.launch import trace_run
from instrument.launch.command_line import build_parser
from instrument.launch.preflight import describe_launch_error
from instrument.supervise import gather, run_outcome
from instrument.supervise.monitor import StepProgress
from instrument.supervise.watchdog import HangDetector
from tracer.vocab.outcomes import HangRule
from viz.views.failures import reported_error

ALL_REDUCE = {"kind": "all_reduce", "group": [0, 1], "seq": 3, "peer": None}


def status(step=1, events=10, final=False, state="running", inflight=(), config=None):
    return {"status": state, "final": final, "step": step, "events": events,
            "last_event_ns": events * 1000, "inflight": list(inflight), "config": config}


def watch(detector, snapshots, alive={0, 1}):
    """Feed (time, statuses) pairs; the verdicts by time (None when no hang)."""
    return [(t, detector.observe(statuses, alive, t)) for t, statuses in snapshots]


def test_a_collective_nobody_leaves_for_the_timeout_is_a_hang():
    waiting = {0: status(inflight=[ALL_REDUCE]), 1: status(events=7)}
    verdicts = watch(HangDetector(5), [(0, waiting), (4.9, waiting), (5, waiting)])
    assert [v for _, v in verdicts][:2] == [None, None]
    assert verdicts[2][1].kind == HangRule.COLLECTIVE


def test_a_slow_start_is_no_hang_however_long():
    # nobody in a collective, nobody finished: imports, rendezvous, clock sync
    starting = {0: status(step=0, events=0), 1: status(step=0, events=0)}
    verdicts = watch(HangDetector(5), [(t, starting) for t in (0, 10, 100, 1000)])
    assert all(v is None for _, v in verdicts)


def test_a_rank_silent_after_another_finished_is_left_behind():
    detector = HangDetector(5)
    # rank 1 went quiet at t=0; rank 0 finishes at t=20: the timeout counts from then
    running = {0: status(events=10), 1: status(events=50)}
    done = {0: status(step=3, events=12, final=True, state="ok"), 1: status(events=50)}
    verdicts = watch(detector, [(0, running), (20, done), (24.9, done), (25, done)],
                     alive={1})
    assert [v for _, v in verdicts][:3] == [None, None, None]
    verdict = verdicts[3][1]
    assert (verdict.kind, verdict.lingering, verdict.finished) == (HangRule.LEFT_BEHIND, [1], [0])


def test_a_rank_that_keeps_recording_after_the_others_finished_is_not_left_behind():
    detector = HangDetector(5)
    done = status(step=3, final=True, state="ok")
    snapshots = [(t, {0: done, 1: status(events=100 + t)}) for t in range(0, 30, 2)]
    assert all(v is None for _, v in watch(detector, snapshots, alive={1}))


def test_a_failed_rank_is_the_agents_business_not_a_left_behind():
    detector = HangDetector(5)
    failed = {0: status(final=True, state="failed"), 1: status()}
    assert all(v is None for _, v in watch(detector, [(t, failed) for t in (0, 10, 60)]))


def test_a_rank_that_closed_its_trace_but_never_exits_is_ended_after_a_grace():
    detector = HangDetector(5, exit_grace_s=30)
    closed = {0: status(final=True, state="ok")}
    verdicts = watch(detector, [(0, closed), (29, closed), (30, closed)], alive={0})
    assert [v for _, v in verdicts][:2] == [None, None]
    assert (verdicts[2][1].kind, verdicts[2][1].lingering) == (HangRule.EXIT, [0])
    # a process that is gone is not waited for
    assert HangDetector(5).observe(closed, set(), 100) is None


def test_step_lines_only_when_the_slowest_rank_advances_at_most_once_a_second():
    lines = []
    progress = StepProgress(2, lines.append)
    at = lambda t, s0, s1, config=None: progress.observe(
        {0: status(step=s0, config=config), 1: status(step=s1, config=config)}, t)
    progress.observe({0: status(step=1)}, 0.0)          # rank 1 not started: nothing known
    at(0.1, 0, 0)                                        # no step has ended yet
    at(0.5, 1, 0)                                        # the slowest has not moved
    at(1.2, 1, 1)
    at(1.3, 2, 2)                                        # too soon after the last line
    at(2.4, 2, 2)
    at(3.5, 5, 5, config={"steps": 5, "tp": 2})
    at(4.6, 5, 5, config={"steps": 5})
    assert lines == ["recorded 1 step", "recorded 2 steps", "recorded 5/5 steps"]


@pytest.mark.parametrize("config", [None, {}, {"steps": "3"}, {"steps": True}, {"steps": 0},
                                    "steps=3"])
def test_step_lines_without_a_usable_total(config):
    lines = []
    StepProgress(1, lines.append).observe({0: status(step=2, config=config)}, 0.0)
    assert lines == ["recorded 2 steps"]


def test_the_collector_is_the_strongest_claim_then_the_lowest_group_rank():
    node = lambda g, claim: {"group_rank": g, "claim": claim, "collector": f"h{g}:1#t"}
    # torch gave group rank 0 to the node started with --node-rank 1
    assert gather.choose_collector([node(0, 0), node(1, 2)])["group_rank"] == 1
    # no --node-rank anywhere: the rendezvous host; several on it (one machine): lowest
    assert gather.choose_collector([node(0, 0), node(1, 1), node(2, 0)])["group_rank"] == 1
    assert gather.choose_collector([node(0, 1), node(1, 1)])["group_rank"] == 0
    assert gather.choose_collector([node(0, 0), node(1, 0)])["group_rank"] == 0


def trace_run_options() -> set:
    """The options of trace-run's parser: this torch's launcher's, which differ by version
    (docs/compat.md: --shutdown-timeout is new in 2.13), and trace-run's own."""
    from torch.distributed.run import get_args_parser
    own = {name for action in build_parser()._actions for name in action.option_strings}
    launcher = {name for action in get_args_parser()._actions for name in action.option_strings}
    assert launcher <= own
    return own


@pytest.mark.parametrize("args, message", [
    (["--nproc-per-node", "0"], "--nproc-per-node must be a number of processes of at least 1"),
    (["--nproc-per-node", "-2"], "(got '-2')"),
    (["--nproc-per-node", "many"], "one of cpu, gpu, xpu, auto (got 'many')"),
    (["--nnodes", "x"], "--nnodes must be N or MIN:MAX with 0 < MIN <= MAX (got 'x')"),
    (["--nnodes", "3:2"], "(got '3:2')"),
    (["--nnodes", "0"], "(got '0')"),
    (["--node-rank", "1"], "--node-rank must be 0 on a single node (got 1)"),
    (["--nnodes", "2", "--node-rank", "2"], "--node-rank must be between 0 and 1 for --nnodes 2"),
    (["--max-restarts", "-1"], "--max-restarts must be 0 or more (got -1)"),
    (["--monitor-interval", "0"], "--monitor-interval must be a positive number of seconds"),
    (["--master-port", "70000"], "--master-port must be between 0 and 65535 (got 70000)"),
    (["--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:99999"],
     "--rdzv-endpoint: The port number of the rendezvous endpoint 'localhost:99999'"),
    (["--nnodes", "2", "--master-addr", "no such host", "--master-port", "1234"],
     "--master-addr: The hostname of the rendezvous endpoint"),
    (["--rdzv-backend", "bogus"], "--rdzv-backend must be one of c10d,"),
    (["--rdzv-conf", "timeout"], "--rdzv-conf: "),
    (["--redirects", "9"], "--redirects: "),
    (["--tee", "x"], "--tee: "),
    (["--local-ranks-filter", "a,b"], "--local-ranks-filter must be local ranks"),
    (["--shutdown-timeout", "-1"], "--shutdown-timeout must be 0 or more (got -1)"),
    (["--signals-to-handle", "SIGTERM,SIGBOGUS"], "--signals-to-handle: no signal named SIGBOGUS"),
    (["--local-addr", "999.1.1.1"], "--local-addr 999.1.1.1: cannot resolve it"),
    (["--timeout", "-5"], "--timeout must be a positive number of seconds (got -5)"),
    (["--timeout", "inf"], "--timeout must be a positive number of seconds (got inf)"),
    (["--stack-depth", "0"], "--stack-depth must be at least 1 (got 0)"),
    (["--steps", ","], "--steps: bad step selection ',': it selects no step"),
    (["--steps", "-1"], "--steps: bad step selection '-1': a range needs its first step "
                        "(steps count from 0: '0-1'"),
    (["--log-dir", "FILE"], "afile is a file, not a directory"),
])
def test_bad_torchrun_option_values_are_one_line_naming_the_option(tmp_path, capsys, args,
                                                                   message):
    out = tmp_path / "run"
    if args == ["--log-dir", "FILE"]:
        args = ["--log-dir", str(tmp_path / "afile")]
        (tmp_path / "afile").write_text("")
    if args[0] not in trace_run_options():      # --shutdown-timeout before torch 2.13
        message = f"unrecognized arguments: {args[0]}"
    try:
        code = trace_run.main([*args, "--out", str(out), __file__])
    except SystemExit as refused:              # argparse's own refusals exit
        code = refused.code
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2
    assert len(err) == 1 and err[0].startswith("trace-run: error: ") and message in err[0], err
    assert not out.exists()               # refused before anything was created or launched


def test_a_bad_device_source_is_one_line_naming_the_variable(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PARATRACE_DEVICE_SOURCE", "nsys")
    code = trace_run.main(["--out", str(tmp_path / "run"), __file__])
    assert code == 2 and capsys.readouterr().err == (
        "trace-run: error: PARATRACE_DEVICE_SOURCE='nsys': expected one of kineto, cupti\n")
    assert not (tmp_path / "run").exists()


def test_a_script_that_is_a_directory_is_named_so(tmp_path, capsys):
    code = trace_run.main(["--out", str(tmp_path / "run"), str(tmp_path)])
    assert code == 2
    assert capsys.readouterr().err == \
        f"trace-run: error: script {tmp_path} is a directory, not a Python file\n"
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("case, message", [
    ("empty", "--out must name a directory (got '')"),
    ("a file", "is a file, not a directory"),
    ("a run", "already holds traces of another run; choose a new DIR"),
    ("its traces", "is a directory of another run's traces (rank-<R>.arrow); choose a new DIR"),
])
def test_an_out_that_cannot_hold_a_new_run_is_refused_untouched(tmp_path, capsys, monkeypatch,
                                                                case, message):
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "earlier"
    (run / "traces").mkdir(parents=True)
    (run / "traces" / "rank-0.arrow").write_bytes(b"an earlier run's trace")
    (tmp_path / "afile").write_text("")
    out = {"empty": "", "a file": str(tmp_path / "afile"), "a run": str(run),
           "its traces": str(run / "traces")}[case]
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    code = trace_run.main(["--out", out, __file__])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2
    assert len(err) == 1 and err[0].startswith("trace-run: error: --out ") and message in err[0]
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_a_launch_error_without_a_message_still_says_where_it_came_from():
    def agent_check():
        raise AssertionError
    with pytest.raises(AssertionError) as info:
        agent_check()
    line = describe_launch_error(info.value)
    assert line.startswith("AssertionError with no message in agent_check (")
    assert describe_launch_error(ValueError("bad\nsecond line")) == "ValueError: bad"


def test_the_report_names_no_rank_trace_run_already_named():
    ranks = {"0": {"status": "failed", "tracer_status": "interrupted", "terminated": False},
             "1": {"status": "failed", "tracer_status": "interrupted", "terminated": False},
             "2": {"status": "ok", "tracer_status": "ok"}}
    # Ctrl-C: "interrupted; the traces hold what was recorded" names every interrupted rank,
    # however far apart the interrupt caught them
    assert trace_run.said_failed({"interrupted": True, "hang": None, "ranks": ranks}) == {0, 1}
    # a hang's banner lists each rank's state; the report's lines stay
    assert trace_run.said_failed({"interrupted": False, "hang": {}, "ranks": ranks}) == set()
    # a failure: the rank that failed was named, a bystander the launcher ended was not
    ranks = {"0": {"status": "failed", "terminated": False},
             "1": {"status": "failed", "terminated": True}, "2": {"status": "ok"}}
    assert trace_run.said_failed({"interrupted": False, "hang": None, "ranks": ranks}) == {0}


def test_hang_blames_the_ranks_the_watchdog_named_and_not_those_that_had_finished():
    outcome = run_outcome.Outcome(ranks={
        "0": {"status": "failed", "exit_code": -15, "failure": None},
        "1": {"status": "failed", "exit_code": -9, "failure": None}})
    hang = {"timeout_s": 3, "kind": HangRule.LEFT_BEHIND, "never_arrived": [], "lingering": [1],
            "ranks": {"0": {"final": True, "status": "ok"}, "1": {"final": False}}}
    outcome.add_hang(hang, 124)
    assert outcome.exit_code == 124 and outcome.first_failure == 1
    # facts in run.json: the rule that blamed rank 1, what rank 0 was doing
    assert outcome.ranks["1"]["failure"] == {"kind": "hang", "ranks": [1],
                                             "cause": HangRule.LEFT_BEHIND, "site": None,
                                             "step": None, "timeout_s": 3}
    assert outcome.ranks["0"]["failure"]["cause"] == "finished"
    assert [outcome.ranks[r]["terminated"] for r in "01"] == [True, False]
    # worded as they always were
    record = {"ranks": outcome.ranks, "hang": hang}
    assert reported_error(record, 1) == \
        "hang: ended by --timeout 3 (recorded nothing after the other ranks finished)"
    assert reported_error(record, 0) == \
        "hang: ended by --timeout 3 (had finished, ended while exiting)"


def test_a_trace_run_claims_to_collect_if_given_node_rank_0_else_on_the_rendezvous_host():
    from types import SimpleNamespace as NS
    c10d = lambda endpoint: NS(rdzv_backend="c10d", rdzv_endpoint=endpoint)
    given = lambda rank: NS(node_rank_given=True, node_rank=rank)
    unnamed = NS(node_rank_given=False, node_rank=0)
    assert trace_run.collector_claim(given(0), c10d("203.0.113.5:29400")) == \
        gather.Claim.NODE_RANK_0
    assert trace_run.collector_claim(given(1), c10d("127.0.0.1:29400")) == gather.Claim.NONE
    assert trace_run.collector_claim(unnamed, c10d("127.0.0.1:29400")) == \
        gather.Claim.RENDEZVOUS_HOST
    # TEST-NET-3: an address no machine here has
    assert trace_run.collector_claim(unnamed, c10d("203.0.113.5:29400")) == gather.Claim.NONE
    # the static rendezvous takes --node-rank as the group rank: node 0 collects, as before
    static = NS(rdzv_backend="static", rdzv_endpoint="127.0.0.1:29500")
    assert trace_run.collector_claim(unnamed, static) == gather.Claim.NODE_RANK_0


def test_the_first_failure_is_the_rank_that_stopped_first_not_torchs_whole_second(tmp_path):
    # rank 0 was SIGKILLed; rank 1 raised "connection closed" a moment later, then was ended;
    # torch compared whole seconds (rank 1's error file against the moment it noticed rank 0)
    # and named rank 1
    from types import SimpleNamespace as NS
    failures = {0: NS(exitcode=-9, message="Signal 9 (SIGKILL) received by PID 7"),
                1: NS(exitcode=-15, message="RuntimeError: Connection closed by peer")}
    failed = NS(failures=failures, get_first_failure=lambda: (1, failures[1]))
    for rank, mtime in ((0, 1000.0), (1, 1000.3)):       # the status files' last writes
        path = tmp_path / f"rank-{rank}.status.json"
        path.write_text("{}")
        os.utime(path, (mtime, mtime))
    outcome = run_outcome.Outcome()
    outcome.add_failures(failed, str(tmp_path))
    assert outcome.first_failure == 0 and outcome.exit_code == 128 + 9
    assert outcome.ranks["0"] == {"status": "failed", "exit_code": -9, "terminated": False,
                                  "failure": {"kind": "error", "ranks": [], "site": None,
                                              "cause": "Signal 9 (SIGKILL) received by PID 7",
                                              "step": None}}
    assert outcome.ranks["1"]["terminated"] is True
    assert outcome.ranks["1"]["failure"] == {
        "kind": "ended", "ranks": [0], "cause": "RuntimeError: Connection closed by peer",
        "site": None, "step": None}
    record = {"ranks": outcome.ranks}
    assert reported_error(record, 0) == "Signal 9 (SIGKILL) received by PID 7"
    assert reported_error(record, 1) == ("ended by the launcher after rank 0 failed; its own "
                                         "end: RuntimeError: Connection closed by peer")
    # a rank without a status file (it died before its tracer started): torch's answer stands
    (tmp_path / "rank-1.status.json").unlink()
    outcome = run_outcome.Outcome()
    outcome.add_failures(failed, str(tmp_path))
    assert outcome.first_failure == 1


def _touch(path, mtime: float) -> None:
    path.write_text("{}")
    os.utime(path, (mtime, mtime))


def test_the_first_failure_is_the_rank_whose_last_sign_of_life_came_first(tmp_path):
    from tracer.files import rundir
    traces = str(tmp_path)
    # rank 0 killed at t=100 before its flusher's first turn: a trace, no status file; rank 1
    # raised "connection reset" at 100.2, its trace and final status written then
    _touch(tmp_path / os.path.basename(rundir.trace_file(traces, 0)), 99.0)
    _touch(tmp_path / os.path.basename(rundir.trace_file(traces, 1)), 100.2)
    _touch(tmp_path / os.path.basename(rundir.status_file(traces, 1)), 100.2)
    assert run_outcome.first_to_stop([1, 0], traces) == 0
    # the latest of a rank's two files counts: rank 0's status at 100.5 is after rank 1's end
    _touch(tmp_path / os.path.basename(rundir.status_file(traces, 0)), 100.5)
    assert run_outcome.first_to_stop([0, 1], traces) == 1
    # a rank with neither file: nothing to compare, torch's answer is used instead
    assert run_outcome.first_to_stop([0, 1, 2], traces) is None


def test_an_error_after_trace_run_died_leaves_the_trace_interrupted(tmp_path, monkeypatch):
    """A rank whose peer trace-run ended left first sees "Connection closed by peer" in a
    collective before its own end comes: its trace says interrupted, as the peer's does, not
    failed (a race seen in test_one_run_per_out_and_no_orphans_after_sigkill)."""
    import tracer
    from instrument.launch import bootstrap
    from instrument.supervise import orphans
    monkeypatch.setenv(orphans.ENV_LAUNCHER, str(os.getppid() + 10 ** 6))   # not our parent
    with pytest.raises(RuntimeError):
        with tracer.trace(str(tmp_path / "gone"), clock_sync=False, device_time=False):
            try:
                raise RuntimeError("Connection closed by peer")
            except BaseException:
                bootstrap._failed_after_the_launcher()
                raise
    gone = tracer.load(str(tmp_path / "gone" / "rank-0.arrow"))
    assert (gone.status, gone.meta["error"]) == ("interrupted", bootstrap.ORPHANED)
    monkeypatch.setenv(orphans.ENV_LAUNCHER, str(os.getppid()))             # alive: a failure
    with pytest.raises(RuntimeError):
        with tracer.trace(str(tmp_path / "alive"), clock_sync=False, device_time=False):
            try:
                raise RuntimeError("Connection closed by peer")
            except BaseException:
                bootstrap._failed_after_the_launcher()
                raise
    alive = tracer.load(str(tmp_path / "alive" / "rank-0.arrow"))
    assert (alive.status, alive.meta["error"]) == ("failed",
                                                   "RuntimeError: Connection closed by peer")


def test_an_abbreviation_of_one_option_in_two_spellings_is_that_option(capsys):
    parser = build_parser()
    for argv in (["--nproc", "2"], ["--nproc=2"], ["--nproc_per", "2"]):
        assert parser.parse_args([*argv, "train.py"]).nproc_per_node == "2", argv
    # different options stay ambiguous, each named once
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["--rdzv", "x", "train.py"])
    assert exit_.value.code == 2
    line = capsys.readouterr().err
    assert "ambiguous option: --rdzv could match" in line and line.count("--rdzv-id") == 1


@pytest.mark.parametrize("given, recorded", [([], True), (["--memory"], True),
                                             (["--no-memory"], False)])
def test_memory_is_on_unless_no_memory_and_the_old_flag_still_parses(given, recorded):
    """Memory is recorded by default (docs/overhead.md, "Memory by default"); ``--memory``, the
    flag old command lines carry, changes nothing; ``--no-memory`` reaches every worker's
    bootstrap, which records ops only."""
    from instrument.launch import bootstrap
    from instrument.launch.command_line import Target, worker_args
    args = build_parser().parse_args([*given, "train.py"])
    argv = worker_args(args, "/tmp/out", Target(script="train.py", module=None, args=[]))
    assert ("--no-memory" in argv) is not recorded and "--memory" not in argv
    own = argv[argv.index("instrument.launch.bootstrap") + 1:]
    assert bootstrap.parse(own).memory is recorded


def test_the_help_names_where_memory_costs_are_and_states_no_number_of_its_own():
    """One place for the number (docs/overhead.md): --help says where, so it cannot disagree
    with the measurement there (it said "about 3x" while the doc said 2.2)."""
    text = " ".join(build_parser().format_help().split())
    entry = text[text.index("--memory, --no-memory"):text.index("--compile-eagerly")]
    assert "On by default" in entry and 'docs/overhead.md, "Memory by default"' in entry
    assert not any(ch.isdigit() for ch in entry.replace("docs/overhead.md", ""))
