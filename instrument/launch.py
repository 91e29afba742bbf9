"""``trace-run``: torchrun with a recorder in every worker.

    trace-run [torchrun options] [trace-run options] [SCRIPT | -m MODULE] [ARGS...]

The command line is torchrun's own parser (``torch.distributed.run.get_args_parser``) with
trace-run's options added, so every torchrun option, in both spellings, means what it means to
torchrun. The run goes through torch's elastic agent (``elastic_launch``), which spawns, monitors
and ends the workers; each worker runs ``instrument.bootstrap``, which starts the tracer and then
the user's script as ``__main__``. Afterwards trace-run writes ``DIR/run.json`` (exit codes,
errors, the hang report), gathers other nodes' traces and builds the report (``viz.cli.build``).
"""
from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Optional

from torch.distributed.elastic.multiprocessing.api import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import elastic_launch

import tracer
from tracer import rundir

from . import gather
from .cli import (EXIT_USAGE, Target, UsageError, build_parser, check_steps, launch_config,
                  prepare_out, resolve_target, worker_args)
from .watchdog import Watchdog, read_statuses

RUN_SCHEMA = "paratrace.run/1"
EXIT_HANG = 124
GATHER_TIMEOUT_S = 120.0
# Exit codes of workers ended from outside (SIGTERM/SIGINT/SIGKILL by the agent or watchdog).
_ENDED = {-signal.SIGTERM, -signal.SIGINT, -signal.SIGKILL, 128 + signal.SIGTERM,
          128 + signal.SIGINT}


@dataclass
class Outcome:
    """How the launch ended, from torch's agent and the watchdog."""

    exit_code: int = 0
    interrupted: bool = False
    ranks: dict = field(default_factory=dict)      # "R" -> {"status", "exit_code", "error"}
    first_failure: Optional[int] = None
    hang: Optional[dict] = None
    error: Optional[str] = None                    # the launch itself failed (rendezvous...)


def run_workers(config, argv: list, traces_dir: str, timeout: Optional[float]) -> Outcome:
    """Launch through torch's elastic agent and classify how each rank ended."""
    outcome = Outcome()
    watchdog = None
    if timeout:
        watchdog = Watchdog(traces_dir, timeout, multi_node=config.max_nodes > 1,
                            on_hang=_print_hang).start()
    try:
        returns = elastic_launch(config, entrypoint=sys.executable)(*argv)
        outcome.ranks = {str(r): {"status": "ok", "exit_code": 0, "error": None}
                         for r in returns}
    except ChildFailedError as exc:
        outcome.first_failure, first = exc.get_first_failure()
        outcome.exit_code = _exit_status(first.exitcode)
        for rank, failure in exc.failures.items():
            outcome.ranks[str(rank)] = _failed_rank(rank, failure, outcome.first_failure)
    except SignalException as exc:
        outcome.interrupted = True
        outcome.exit_code = 128 + int(exc.sigval)
    except KeyboardInterrupt:
        outcome.interrupted, outcome.exit_code = True, 128 + signal.SIGINT
    except Exception as exc:  # rendezvous and agent errors: report them, keep what was recorded
        outcome.error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        outcome.exit_code = 1
    finally:
        if watchdog is not None:
            watchdog.stop()
    if watchdog is not None and watchdog.hang is not None:
        outcome.hang = watchdog.hang
        outcome.exit_code = EXIT_HANG
        late = outcome.hang["never_arrived"]
        outcome.first_failure = late[0] if late else None
        for rank, info in outcome.ranks.items():
            cause = "never arrived at the collective the others waited in" \
                if int(rank) in late else "waiting"
            info.update(error=f"hang: ended by --timeout {watchdog.timeout_s:g} ({cause})",
                        terminated=int(rank) not in late)
    return outcome


def _exit_status(code: int) -> int:
    """A worker's exit code as a shell would report it (killed by signal N: 128 + N)."""
    return 128 - code if code < 0 else (code or 1)


def _failed_rank(rank: int, failure, first: int) -> dict:
    """run.json entry of a rank torch's agent reported failed; ``terminated``: a bystander the
    launcher ended because rank ``first`` failed."""
    message = failure.message
    if isinstance(message, dict):          # torch's error file: {"message": ..., "extraInfo"}
        message = message.get("message")
    if not message or str(message).startswith("To enable traceback"):
        message = f"exit code {failure.exitcode}"
    terminated = rank != first and failure.exitcode in _ENDED
    if terminated:
        message = f"ended by the launcher after rank {first} failed ({message})"
    return {"status": "failed", "exit_code": failure.exitcode, "error": str(message),
            "terminated": terminated}


def _print_hang(hang: dict) -> None:
    late = ", ".join(map(str, hang["never_arrived"])) or "unknown"
    print(f"trace-run: no rank made progress for {hang['timeout_s']:g}s: rank(s) {late} never "
          "arrived at the collective the others wait in; ending the workers", file=sys.stderr,
          flush=True)


def local_ranks(outcome: Outcome, traces_dir: str, remote: set) -> dict:
    """Every rank this node ran: the agent's results plus ranks that wrote a status file
    (``remote``: ranks other nodes uploaded into the same directory)."""
    ranks = dict(outcome.ranks)
    for rank, status in read_statuses(traces_dir).items():
        if rank in remote and str(rank) not in ranks:
            continue
        entry = ranks.setdefault(str(rank), {"status": None, "exit_code": None, "error": None})
        entry["last_collective"] = status.get("last_collective")
        entry["tracer_status"] = status.get("status")
        if entry["status"] is None:
            # not reported by the agent: the run ended early (hang, Ctrl-C, launch error)
            entry["status"] = "ok" if status.get("status") == "ok" else "failed"
            if entry["status"] == "failed":
                entry["error"] = "interrupted" if outcome.interrupted else (
                    "ended by the watchdog (hang)" if outcome.hang else outcome.error)
    return dict(sorted(ranks.items(), key=lambda kv: int(kv[0])))


def root_cause(ranks: dict, traces_dir: str, fallback: Optional[int]) -> Optional[int]:
    """Across nodes, the failed rank whose tracer closed first (its trace's ``end_unix``).

    Each node's agent only knows its own ranks: when a rank on node 1 raises, node 0's ranks
    fail a moment later with "connection closed by peer", and node 0's first failure is that.
    """
    ended = {}
    for rank, info in ranks.items():
        if info.get("status") != "failed" or info.get("terminated"):
            continue
        try:
            end = tracer.load(rundir.trace_file(traces_dir, rank)).meta.get("end_unix")
        except tracer.TraceError:
            continue
        if end is not None:
            ended[int(rank)] = end
    return min(ended, key=ended.get) if ended else fallback


def _remove_empty_stack_files(traces_dir: str) -> None:
    """The bootstrap opens rank-<R>.stack.txt for faulthandler; keep only real dumps."""
    for name in os.listdir(traces_dir):
        path = os.path.join(traces_dir, name)
        if name.endswith(".stack.txt") and os.path.getsize(path) == 0:
            os.remove(path)


def write_run_json(out: str, record: dict) -> None:
    tmp = os.path.join(out, rundir.RUN_RECORD + ".tmp")
    with open(tmp, "w") as fh:
        json.dump(record, fh, indent=1)
    os.replace(tmp, os.path.join(out, rundir.RUN_RECORD))


def build_report(out: str) -> Optional[str]:
    """viz.cli.build; None (with a one-line message) if nothing could be built."""
    try:
        from viz.cli import build
        from viz.run import RunError
    except ImportError as exc:
        print(f"trace-run: report builder unavailable ({exc})", file=sys.stderr)
        return None
    try:
        index, _ = build(out, warn=lambda line: print(f"trace-run: {line}", file=sys.stderr,
                                                      flush=True))
        return index
    except (RunError, OSError, ValueError) as exc:
        print(f"trace-run: no report: {exc}", file=sys.stderr)
        return None
    except Exception as exc:  # a bug in a renderer must not hide the traces already on disk
        print(f"trace-run: no report: the report builder failed ({type(exc).__name__}: {exc}); "
              f"the traces are in {out}, run trace-report {out} after a fix", file=sys.stderr)
        return None


def main(argv: Optional[list] = None) -> int:
    command = ["trace-run", *(sys.argv[1:] if argv is None else argv)]
    args = build_parser().parse_args(command[1:])
    try:
        target = resolve_target(args)
        if args.stack_depth < 1:
            raise UsageError("--stack-depth must be at least 1")
        if args.timeout is not None and args.timeout <= 0:
            raise UsageError("--timeout must be a positive number of seconds")
        check_steps(args.steps)
        config = launch_config(args)
        out = prepare_out(args.out)
    except UsageError as exc:
        print(f"trace-run: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        return _run(args, config, target, out, command)
    except KeyboardInterrupt:   # a second Ctrl-C while gathering or building the report
        print("trace-run: interrupted", file=sys.stderr)
        return 128 + signal.SIGINT


def _run(args, config, target: Target, out: str, command: list) -> int:
    traces_dir = os.path.join(out, rundir.TRACES)
    collector = None
    if config.max_nodes > 1:
        collector = gather.Collector(traces_dir, config.local_addr or socket.getfqdn())
        os.environ[gather.ENV_COLLECTOR] = collector.start()
    started = time.time()
    outcome = run_workers(config, worker_args(args, out, target), traces_dir, args.timeout)
    _remove_empty_stack_files(traces_dir)
    ranks = local_ranks(outcome, traces_dir, collector.incoming if collector else set())
    node = gather.read_node(out)
    if node is None:
        if config.min_nodes > 1 and outcome.ranks:   # several nodes for sure, no exchange
            print("trace-run: the nodes never exchanged the collector's address; this node's "
                  f"traces stay in {traces_dir}", file=sys.stderr)
        node = {"group_rank": 0, "group_world_size": 1}
    record = {
        "schema": RUN_SCHEMA, "command": command,
        "target": {"script": target.script and os.path.abspath(target.script),
                   "module": target.module, "args": target.args},
        "nnodes": node["group_world_size"], "node_rank": node["group_rank"],
        "world_size": config.nproc_per_node * node["group_world_size"],
        "started_unix": started, "ended_unix": time.time(), "exit_code": outcome.exit_code,
        "interrupted": outcome.interrupted, "first_failure": outcome.first_failure,
        "launch_error": outcome.error, "ranks": dict(ranks), "hang": outcome.hang, "nodes": {},
    }
    if outcome.error:
        print(f"trace-run: the launch failed: {outcome.error}", file=sys.stderr)
    if outcome.interrupted:
        print("trace-run: interrupted; the traces hold what was recorded", file=sys.stderr)
    for rank, info in ranks.items():
        if info["status"] == "failed" and not (info.get("terminated") or outcome.hang
                                               or outcome.interrupted):
            print(f"trace-run: rank {rank} failed: {info['error']}", file=sys.stderr)

    if node["group_rank"] != 0:
        write_run_json(out, record)
        try:
            where = gather.send(node["collector"], traces_dir, node["group_rank"], ranks)
        except gather.GatherError as exc:
            print(f"trace-run: {exc}; this node's traces stay in {traces_dir}", file=sys.stderr)
            return outcome.exit_code or 1
        if collector is not None:
            collector.stop()
        print(f"trace-run: node {node['group_rank']}: traces of ranks {', '.join(ranks)} sent "
              f"to node 0 ({node['collector'].partition('#')[0]}), into {where}")
        return outcome.exit_code

    if collector is not None:
        own_ranks = sorted(map(int, ranks))
        expected = node["group_world_size"] - 1
        if not collector.wait(expected, max(GATHER_TIMEOUT_S, args.timeout or 0)):
            print(f"trace-run: only {len(collector.uploads)} of {expected} other nodes sent "
                  "their traces; the report shows what arrived", file=sys.stderr)
        collector.stop()
        for upload in collector.uploads.values():
            record["ranks"].update(upload.ranks)
            record["nodes"][str(upload.node_rank)] = {"host": upload.peer, "files": upload.files,
                                                      "ranks": sorted(map(int, upload.ranks))}
        record["ranks"] = dict(sorted(record["ranks"].items(), key=lambda kv: int(kv[0])))
        record["nodes"]["0"] = {"host": socket.getfqdn(), "ranks": own_ranks}
        record["nodes_missing"] = [n for n in range(1, node["group_world_size"])
                                   if n not in collector.uploads]
        if any(info["status"] == "failed" for info in record["ranks"].values()):
            record["exit_code"] = outcome.exit_code = outcome.exit_code or 1
            first = record["first_failure"] = root_cause(record["ranks"], traces_dir,
                                                         record["first_failure"])
            if first is not None and first not in own_ranks:
                print(f"trace-run: first failure, on another node: rank {first}: "
                      f"{record['ranks'][str(first)]['error']}", file=sys.stderr)
    write_run_json(out, record)
    if args.no_report:
        print(out)
        return outcome.exit_code
    report = build_report(out)
    print(report or out)
    return outcome.exit_code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
