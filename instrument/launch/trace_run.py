"""``trace-run``: torchrun with a recorder in every worker.

    trace-run [torchrun options] [trace-run options] [SCRIPT | -m MODULE] [ARGS...]

The command line is torchrun's own parser (``torch.distributed.run.get_args_parser``) with
trace-run's options added, so every torchrun option, in both spellings, means what it means to
torchrun. A run goes parse -> launch -> record -> gather -> report:

- **parse** (:func:`prepare`): every option checked before anything starts (command_line,
  preflight), then DIR locked for the whole run (:func:`hold_run_dir`: one trace-run per directory);
- **launch** (:func:`launch`): torch's elastic agent (``elastic_launch``) spawns, monitors and
  ends the workers; each runs ``instrument.launch.bootstrap`` (the tracer, then the user's
  script as ``__main__``) while :class:`~instrument.supervise.monitor.Monitor` prints progress
  and watches for hangs; with ``--no-launcher``, one process without torchrun's environment
  (instrument.launch.single);
- **record** (:func:`record_run`): ``DIR/run.json`` (instrument.supervise.run_outcome makes it,
  tracer.files.run_record writes it), facts only; once the workers have run, trace-run says
  what went wrong in the words of ``viz.views.failures`` (the report's words), imported then:
  nothing of viz is loaded while the workers run;
- **gather** (:func:`gather_traces`, :func:`send_traces`): on multi-node runs every node's traces
  go to the collecting node (instrument.supervise.gather);
- **report** (:func:`report`): ``viz.cli.build``; the last line on stdout is its path.
"""
from __future__ import annotations

import argparse
import os
import shlex
import signal
import socket
import sys
import time
from types import ModuleType
from typing import Optional

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from tracer.files import run_record, rundir
from tracer.files.run_record import RunRecord
from tracer.vocab.console_errors import EXIT_USAGE
from tracer.vocab.outcomes import RankStatus, TraceStatus

from ..supervise import gather, orphans, run_outcome
from ..supervise.gather import NodeRecord
from ..supervise.monitor import Monitor, say
from ..supervise.run_outcome import EXIT_HANG, Outcome
from . import preflight, single
from .command_line import (Target, UsageError, build_parser, check_run_dir, check_own_options,
                           prepare_run_dir, resolve_target, worker_args)
from .preflight import describe_launch_error, is_this_machine, launch_config, rendezvous_host
from .single import SingleProcess

EXIT_LAUNCH = 1
GATHER_TIMEOUT_S = 120.0


def main(argv: Optional[list[str]] = None) -> int:
    command = ["trace-run", *(sys.argv[1:] if argv is None else argv)]
    args = build_parser().parse_args(command[1:])
    try:
        target, config, run_dir = prepare(args)
        lock = hold_run_dir(run_dir)
    except UsageError as exc:
        print(f"trace-run: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return run(args, config, target, run_dir, command)
    except KeyboardInterrupt:   # a second Ctrl-C while gathering or building the report
        say("interrupted")
        return 128 + signal.SIGINT
    finally:
        os.close(lock)


def prepare(args: argparse.Namespace) -> tuple[Target, LaunchConfig | SingleProcess, str]:
    """Check everything before launching: (what to run, torch's LaunchConfig or, with
    --no-launcher, single.SingleProcess, the run DIR)."""
    target = resolve_target(args)
    check_own_options(args)
    check_run_dir(args.out)
    if args.no_launcher:
        try:
            single.check_options(args)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    preflight.check_reference_gpt_device(target.module, target.args, args.nproc_per_node)
    config = single.SingleProcess() if args.no_launcher else launch_config(args)
    run_dir = prepare_run_dir(args.out)
    return target, config, run_dir


def hold_run_dir(run_dir: str) -> int:
    """Take DIR's lock for the whole run (launch, record, gather, report): a second trace-run
    on DIR, or a trace-report writing into it, is refused while this one writes. Checked
    again under the lock: a run may have filled DIR since :func:`prepare` looked."""
    try:
        lock = rundir.lock_run(run_dir)
    except rundir.RunLocked as exc:
        raise UsageError(f"--out {run_dir} is being written by another trace-run (pid "
                         f"{exc.pid or 'unknown'}); choose a new DIR") from None
    except OSError as exc:
        raise UsageError(f"cannot write to --out {run_dir}: {exc.strerror or exc}") from None
    try:
        check_run_dir(run_dir)
    except UsageError:
        os.close(lock)
        raise
    return lock


def run(args: argparse.Namespace, config: LaunchConfig | SingleProcess, target: Target,
        run_dir: str, command: list[str]) -> int:
    traces_dir = os.path.join(run_dir, rundir.TRACES)
    collector = start_collector(args, config, traces_dir) \
        if not isinstance(config, SingleProcess) and config.max_nodes > 1 else None
    started = time.time()
    if isinstance(config, SingleProcess):          # --no-launcher
        outcome = single.launch(worker_args(args, run_dir, target), traces_dir,
                                describe_target(target), timeout=args.timeout)
    else:
        outcome = launch(config, worker_args(args, run_dir, target), traces_dir, target,
                         timeout=args.timeout)
    record, node = record_run(config, target, run_dir, command, outcome, started,
                              remote=collector.incoming if collector else set())
    local = set(record["ranks"])
    if collector is not None and (not node["collects"] or node["group_world_size"] == 1):
        collector.stop()
    if not node["collects"]:
        say_failures(record, local)
        return send_traces(run_dir, record, node)
    if node["group_world_size"] > 1:
        # node.json comes from the workers of multi-node runs only, which start a collector
        assert collector is not None
        gather_traces(record, collector, node, traces_dir, args.timeout)
    say_failures(record, local)
    try:
        run_record.write(run_dir, record)
    except OSError as exc:
        say(f"cannot write {os.path.join(run_dir, rundir.RUN_RECORD)}: {exc.strerror or exc}")
        record["exit_code"] = record["exit_code"] or 1
    # a launch that never started a worker has nothing to draw: its one line said it all
    nothing = outcome.error is not None and not record["ranks"]
    return report(run_dir, record["exit_code"], args.no_report or nothing, said_failed(record),
                  sources=not args.no_source)


def start_collector(args: argparse.Namespace, config: LaunchConfig, traces_dir: str
                    ) -> gather.Collector:
    """Multi-node: listen for other nodes' traces; the workers learn the address and whether
    this trace-run claims to collect (bootstrap -> gather.announce)."""
    collector = gather.Collector(traces_dir, config.local_addr or socket.getfqdn())
    os.environ[gather.ENV_COLLECTOR] = collector.start()
    os.environ[gather.ENV_CLAIM] = str(int(collector_claim(args, config)))
    return collector


def collector_claim(args: argparse.Namespace, config: LaunchConfig) -> int:
    """How strongly this trace-run claims to collect the traces (gather.choose_collector)."""
    if args.node_rank_given or config.rdzv_backend == "static":
        return gather.Claim.NODE_RANK_0 if args.node_rank == 0 else gather.Claim.NONE
    if is_this_machine(rendezvous_host(config)):
        return gather.Claim.RENDEZVOUS_HOST
    return gather.Claim.NONE


def launch(config: LaunchConfig, argv: list[str], traces_dir: str, target: Target, *,
           timeout: Optional[float]) -> Outcome:
    """Launch through torch's elastic agent and classify how each rank ended."""
    say(f"launching {describe_launch(config, target)}")
    os.environ.update(orphans.become_subreaper())   # workers die with trace-run (orphans.py)
    outcome = Outcome()
    monitor = Monitor(traces_dir, ranks=config.nproc_per_node, timeout_s=timeout,
                      multi_node=config.max_nodes > 1).start()
    try:
        returns = elastic_launch(config, entrypoint=sys.executable)(*argv)
        outcome.ranks = {str(r): {"status": RankStatus.OK, "exit_code": 0, "failure": None}
                         for r in returns}
    except ChildFailedError as exc:
        outcome.add_failures(exc, traces_dir)
    except SignalException as exc:
        outcome.interrupted, outcome.exit_code = True, 128 + int(exc.sigval)
    except KeyboardInterrupt:
        outcome.interrupted, outcome.exit_code = True, 128 + signal.SIGINT
    except Exception as exc:  # rendezvous and agent errors: report them, keep what was recorded
        outcome.error, outcome.exit_code = describe_launch_error(exc, config), EXIT_LAUNCH
    finally:
        monitor.stop()
        orphans.end_orphans()    # what SIGKILLed workers forked, handed to trace-run
    if monitor.hang is not None:
        outcome.add_hang(monitor.hang, EXIT_HANG)
    return outcome


def describe_launch(config: LaunchConfig, target: Target) -> str:
    """``N ranks (what they run)`` for the launching line."""
    what = describe_target(target)
    ranks = f"{config.nproc_per_node} rank{'s' if config.nproc_per_node != 1 else ''}"
    if config.max_nodes == 1:
        return f"{ranks} ({what})"
    nodes = str(config.max_nodes) if config.min_nodes == config.max_nodes else \
        f"{config.min_nodes}-{config.max_nodes}"
    return (f"{ranks} on this node, one of {nodes} nodes ({what}; rendezvous "
            f"{config.rdzv_backend} at {config.rdzv_endpoint})")


def describe_target(target: Target) -> str:
    """What runs, for trace-run's lines: ``train.py --lr 3e-4`` (72 characters at most)."""
    run = [os.path.basename(target.script)] if target.script else ["-m", target.module]
    what = shlex.join([*run, *target.args])
    return what if len(what) <= 72 else what[:69] + "..."


def record_run(config: LaunchConfig | SingleProcess, target: Target, run_dir: str,
               command: list[str], outcome: Outcome, started: float, remote: set[int]
               ) -> tuple[RunRecord, NodeRecord]:
    """This node's run.json record, and what it learned about the other nodes (node.json).
    Prints one line per problem, the watchdog's first (it ended the workers)."""
    if outcome.hang is not None:
        say(run_words().watchdog_line(outcome.hang))
    traces_dir = os.path.join(run_dir, rundir.TRACES)
    _remove_empty_stack_files(traces_dir)
    ranks = run_outcome.local_ranks(outcome, traces_dir, remote)
    node = gather.read_node(run_dir)
    if node is None:
        if config.min_nodes > 1 and outcome.ranks:   # several nodes for sure, no exchange
            say(f"the nodes never exchanged the collector's address; this node's traces stay "
                f"in {traces_dir}")
        node = NodeRecord(group_rank=0, group_world_size=1, collects=True)
    record = run_outcome.new_record(
        command=command, target=target.recorded(), node=node, outcome=outcome, ranks=ranks,
        world_size=config.nproc_per_node * node["group_world_size"], started=started)
    if outcome.error:
        say(f"the launch failed: {outcome.error}")
    if outcome.interrupted:
        say("interrupted; the traces hold what was recorded")
    return record, node


def say_failures(record: RunRecord, local: set[str]) -> None:
    """The first failure in one line (viz.views.failures words it), if a rank failed."""
    line = run_words().first_failure_line(record, local)
    if line:
        say(line)


def run_words() -> ModuleType:
    """viz.views.failures, which words run.json's facts as the report does; imported only once
    the workers have run (tests/unit/test_architecture.py checks that nothing trace-run runs
    beside them imports viz)."""
    from viz.views import failures
    return failures


def send_traces(run_dir: str, record: RunRecord, node: NodeRecord) -> int:
    """Not the collector: keep a run.json here and send the traces to the collecting node."""
    traces_dir = os.path.join(run_dir, rundir.TRACES)
    exit_code = record["exit_code"]
    try:
        run_record.write(run_dir, record)
    except OSError as exc:
        say(f"cannot write {os.path.join(run_dir, rundir.RUN_RECORD)}: {exc.strerror or exc}")
    if node.get("claim") == gather.Claim.NODE_RANK_0 and node.get("rival_claims"):
        say(f"another node was also given --node-rank 0; node {node['collector_node']} "
            "collects the traces")
    try:
        where = gather.send(node["collector"], traces_dir, node["group_rank"], record["ranks"])
    except gather.GatherError as exc:
        say(f"{exc}; this node's traces stay in {traces_dir}")
        return exit_code or 1
    ranks = ", ".join(record["ranks"]) or "none"
    print(f"trace-run: traces of ranks {ranks} sent to the collecting node "
          f"({node['collector'].partition('#')[0]}), into {where}", flush=True)
    return exit_code


def gather_traces(record: RunRecord, collector: gather.Collector, node: NodeRecord, traces_dir: str,
                  timeout: Optional[float]) -> None:
    """The collector: wait for every other node's traces, merge their ranks into ``record``
    and find the first failure across nodes."""
    expected = node["group_world_size"] - 1
    say(f"gathering traces from {expected} other node{'s' if expected != 1 else ''}")
    if not collector.wait(expected, max(GATHER_TIMEOUT_S, timeout or 0)):
        say(f"only {len(collector.uploads)} of {expected} other nodes sent their traces; "
            "the report shows what arrived")
    collector.stop()
    run_outcome.merge_uploads(record, collector.uploads, node, socket.getfqdn())
    if any(info["status"] == RankStatus.FAILED for info in record["ranks"].values()):
        record["exit_code"] = record["exit_code"] or 1
        record["first_failure"] = run_outcome.root_cause(record["ranks"], traces_dir,
                                                        record["first_failure"])


def report(run_dir: str, exit_code: int, no_report: bool, reported: frozenset[int] = frozenset(), *,
           sources: bool = True) -> int:
    """Build the report (unless --no-report; ``sources=False``: --no-source); the last line on
    stdout is its path, or DIR."""
    index = None
    if not no_report:
        say("building the report")
        index = build_report(run_dir, reported, sources)
    print(index or run_dir, flush=True)
    return exit_code


def said_failed(record: RunRecord) -> frozenset[int]:
    """Ranks whose end trace-run already named: the report says them no second time. After
    Ctrl-C that is every rank the interrupt stopped ("interrupted; the traces hold what was
    recorded"): ranks stop a collective or two apart, which needs no line per rank."""
    if record["interrupted"]:
        return frozenset(int(r) for r, info in record["ranks"].items()
                         if info.get("tracer_status") == TraceStatus.INTERRUPTED)
    if record["hang"] is not None:
        return frozenset()
    return frozenset(int(r) for r, info in record["ranks"].items()
                     if info["status"] == RankStatus.FAILED and not info.get("terminated"))


def build_report(run_dir: str, reported: frozenset[int] = frozenset(), sources: bool = True
                 ) -> Optional[str]:
    """viz.cli.build; None (with a one-line message) if nothing could be built. viz names each
    damaged or missing trace itself, one line each, and the ranks in ``reported`` (failures
    already said) no second time."""
    try:
        from viz.cli import build
        from viz.render.callgraph_svg import RenderError
        from viz.run import RunError
    except ImportError as exc:
        say(f"report builder unavailable ({exc})")
        return None
    try:
        index, _ = build(run_dir, warn=say, reported=reported, sources=sources)
        return index
    except (RunError, RenderError, OSError, ValueError) as exc:
        say(f"no report: {exc}")
        return None
    except Exception as exc:  # a bug in a renderer must not hide the traces already on disk
        say(f"no report: the report builder failed ({type(exc).__name__}: {exc}); the traces "
            f"are in {run_dir}, run trace-report {run_dir} after a fix")
        return None


def _remove_empty_stack_files(traces_dir: str) -> None:
    """The bootstrap opens rank-<R>.stack.txt for faulthandler; keep only real dumps."""
    try:
        paths = rundir.rank_files(traces_dir, rundir.STACK_EXT).values()
    except OSError:
        return
    for path in paths:
        try:
            if os.path.getsize(path) == 0:
                os.remove(path)
        except OSError:
            pass
