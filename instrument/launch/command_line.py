"""trace-run's command line: torchrun's own parser plus trace-run's options, and its checks.

Every torchrun option comes from ``torch.distributed.run.get_args_parser()``, so it is accepted
in both spellings and means what it means to torchrun; trace-run adds its own options (which
collide with none of torchrun's), makes SCRIPT optional (the reference GPT is the default), and
turns every bad input into one line on stderr and exit status 2.
"""
from __future__ import annotations

import argparse
import datetime
import importlib.util
import os
import sys
import tempfile
import uuid
from dataclasses import dataclass
from typing import Any, Optional

from torch.distributed import run as torchrun

from tracer.files import rundir
from tracer.files.run_record import RunTarget
from tracer.vocab.console_errors import CommandParser, as_command_parser

DEFAULT_MODULE = "sample_runs.train"
USAGE = "trace-run [torchrun options] [trace-run options] [SCRIPT | -m MODULE] [ARGS...]"


class UsageError(Exception):
    """Bad command line or output directory: one line, exit status 2."""


@dataclass
class Target:
    """What each worker runs."""

    script: Optional[str]
    module: Optional[str]
    args: list[str]

    def recorded(self) -> RunTarget:
        """run.json's ``target``: the script's absolute path, or the module, and the
        arguments."""
        return {"script": self.script and os.path.abspath(self.script), "module": self.module,
                "args": self.args}


def build_parser() -> CommandParser:
    """torchrun's parser plus trace-run's own options; SCRIPT becomes optional."""
    parser = torchrun.get_args_parser()
    # "no --master-port given" must read the same on every torch: before 2.13 the parser's
    # default is 29500, and a one-node run then took a static rendezvous there, failing when
    # anything else held that port (another run, a torchrun job; preflight.launch_config)
    parser.set_defaults(master_port=None)
    parser.prog = "trace-run"
    parser.usage = USAGE
    parser.description = ("Run a torchrun-style training with paratrace's recorder in every "
                          "worker, then write summary.json and the report. Without SCRIPT it "
                          f"runs the reference GPT (-m {DEFAULT_MODULE}, default configuration).")
    own = parser.add_argument_group("trace-run options")
    own.add_argument("--out", metavar="DIR", default=None,
                     help="output directory (default: ./traces/<timestamp>); traces go to "
                     "DIR/traces, the report to DIR/index.html")
    own.add_argument("--steps", metavar="SPEC", default=None,
                     help="steps to record, 0-based: '1-3', '0,2', '2-' (default: all)")
    own.add_argument("--stack-depth", type=int, default=64, metavar="N",
                     help="user frames kept per stack (default 64)")
    own.add_argument("--include-library-frames", action="store_true",
                     help="keep library frames (torch, the stdlib) in stacks too")
    own.add_argument("--library", dest="library_specs", action="append", default=[],
                     metavar="PKG[,PKG]",
                     help="count these installed packages as library code (their frames fold "
                     "into the call into them), e.g. accelerate; 'site-packages' for every "
                     "installed package. By default only torch, the standard library and "
                     "paratrace are library: transformers', Lightning's frames are shown")
    own.add_argument("--no-library", dest="library_specs", action="append", metavar="PKG[,PKG]",
                     type=lambda value: ",".join("-" + p.strip() for p in value.split(",")),
                     help="count these packages as the user's code, e.g. torch, or one of "
                     "--library site-packages")
    own.add_argument("--no-device-time", action="store_true",
                     help="on CUDA, do not record GPU activity (CUPTI, driven directly; "
                     "PARATRACE_DEVICE_SOURCE=kineto takes it through torch's Kineto instead); "
                     "op times are then host launch times")
    own.add_argument("--memory", action=argparse.BooleanOptionalAction, default=True,
                     help="record every storage's bytes, free and category (parameters, "
                     "gradients, optimizer state, activations, temporaries, comm): the report's "
                     "memory peaks. On by default (--memory is accepted and changes nothing); "
                     "it adds to the recorder's cost, --no-memory records ops only (the "
                     "numbers: docs/overhead.md, \"Memory by default\")")
    own.add_argument("--compile-eagerly", action="store_true",
                     help="run torch.compile'd code eagerly, op by op, for full op detail "
                     "(default: compiled code runs compiled, one range per compiled graph)")
    own.add_argument("--no-launcher", action="store_true",
                     help="run SCRIPT in one process as `python SCRIPT ARGS` would, without "
                     "torchrun's environment (no RANK, WORLD_SIZE, MASTER_ADDR...); the same "
                     "report")
    own.add_argument("--no-report", action="store_true",
                     help="only record: skip summary.json and the HTML report")
    own.add_argument("--no-source", action="store_true",
                     help="the report reads no source file (source pages list only the lines "
                     "that issued ops): a report to share")
    own.add_argument("--timeout", type=float, metavar="SECONDS", default=None,
                     help="end the run when no rank makes progress for this long while one "
                     "waits in a collective, or a rank records nothing this long after another "
                     "finished; report each rank's last collective and stack (exit 124)")
    parser._optionals.title = "torchrun options"
    for action in parser._actions:
        if action.dest == "training_script":
            action.nargs, action.default, action.metavar = "?", None, "SCRIPT | MODULE"
            action.help = ("the training script (a module with -m); default: the reference GPT "
                           f"(-m {DEFAULT_MODULE})")
        elif action.dest == "training_script_args":
            action.metavar, action.help = "ARGS", "the script's own arguments, passed unchanged"
        elif action.dest == "nproc_per_node" and "PET_NPROC_PER_NODE" not in os.environ:
            action.default = None     # unset: 1, or DEFAULT_WORLD_SIZE for the reference GPT
        elif action.dest == "node_rank" and "PET_NODE_RANK" not in os.environ:
            action.default = None     # unset: 0, but only a given --node-rank 0 collects
    _one_option_one_match(parser)
    return as_command_parser(parser)


def _one_option_one_match(parser: argparse.ArgumentParser) -> None:
    """An abbreviation that matches two spellings of one option (``--nproc``: torchrun's
    ``--nproc-per-node`` and ``--nproc_per_node``) means that option, where argparse calls it
    ambiguous; one that matches different options stays ambiguous."""
    matches = parser._get_option_tuples

    def by_option(option_string: str) -> list[tuple[Any, ...]]:
        found: dict[int, tuple[Any, ...]] = {}
        for match in matches(option_string):       # (action, option string, ...), any Python
            found.setdefault(id(match[0]), match)
        return list(found.values())
    setattr(parser, "_get_option_tuples", by_option)     # this parser's own, a private hook


def resolve_target(args: argparse.Namespace) -> Target:
    """The script or module to run; the reference GPT when none is given."""
    if args.training_script is None:
        if args.module:
            raise UsageError("-m needs a MODULE")
        import sample_runs.train
        if args.nproc_per_node is None and not args.no_launcher:
            args.nproc_per_node = str(sample_runs.train.DEFAULT_WORLD_SIZE)
        return Target(None, DEFAULT_MODULE, [])
    if args.nproc_per_node is None:
        args.nproc_per_node = "1"
    if args.no_python:
        raise UsageError("--no-python runs a non-Python program, which cannot be traced")
    if args.module:
        name = args.training_script
        # Workers run `python -m` from this directory; look the module up the same way.
        sys.path.insert(0, os.getcwd())
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        finally:
            sys.path.pop(0)
        if not found:
            raise UsageError(f"no module named {name!r}")
        return Target(None, name, list(args.training_script_args))
    if os.path.isdir(args.training_script):
        raise UsageError(f"script {args.training_script} is a directory, not a Python file")
    if not os.path.isfile(args.training_script):
        raise UsageError(f"script not found: {args.training_script}")
    return Target(args.training_script, None, list(args.training_script_args))


def check_run_dir(run_dir: Optional[str]) -> None:
    """Refuse an --out that cannot hold a new run, touching nothing (so the error comes before
    torch's launcher prints anything): empty, a file, or a directory of another run's traces
    (its run directory, or the traces directory itself)."""
    if run_dir is None:
        return
    if not run_dir.strip():
        raise UsageError("--out must name a directory (got '')")
    path = os.path.abspath(run_dir)
    if os.path.exists(path) and not os.path.isdir(path):
        raise UsageError(f"--out {path} is a file, not a directory")
    for holder in (path, os.path.join(path, rundir.TRACES)):
        try:
            names = os.listdir(holder)
        except OSError:
            continue
        if any(rundir.parse_rank_file(name) is not None for name in names):
            what = "already holds traces of another run" if holder != path else \
                "is a directory of another run's traces (rank-<R>.arrow)"
            raise UsageError(f"--out {path} {what}; choose a new DIR")


def prepare_run_dir(run_dir: Optional[str]) -> str:
    """Create DIR/traces and check it is writable; refuse to mix with an earlier run's traces."""
    check_run_dir(run_dir)
    if run_dir is None:
        run_dir = os.path.join("traces", datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
        if os.path.exists(run_dir):
            run_dir += "-" + uuid.uuid4().hex[:6]
    run_dir = os.path.abspath(run_dir)
    traces = os.path.join(run_dir, rundir.TRACES)
    try:
        os.makedirs(traces, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=traces):
            pass
    except OSError as exc:
        raise UsageError(f"cannot write to --out {run_dir}: {exc.strerror or exc}") from None
    return run_dir


def worker_args(args: argparse.Namespace, run_dir: str, target: Target) -> list[str]:
    """Arguments of ``python`` for each worker: the bootstrap, its options, then the target."""
    own = ["--out", run_dir, "--stack-depth", str(args.stack_depth)]
    if args.steps is not None:
        own += ["--steps", args.steps]
    if args.include_library_frames:
        own.append("--include-library-frames")
    # NOTE: "--library=-torch": a separate "-torch" would read as an option
    own += [f"--library={spec}" for spec in args.library_specs]
    if args.no_device_time:
        own.append("--no-device-time")
    if args.compile_eagerly:
        own.append("--compile-eagerly")
    if not args.memory:
        own.append("--no-memory")
    run = ["-m", target.module] if target.module else [target.script]
    # NOTE: -u keeps the launcher's workers' output in step; --no-launcher runs as python does
    unbuffered = [] if args.no_launcher else ["-u"]
    return [*unbuffered, "-m", "instrument.launch.bootstrap", *own, "--", *run, *target.args]


def check_own_options(args: argparse.Namespace) -> None:
    """trace-run's own options (torchrun's are checked by instrument.launch.preflight)."""
    from tracer.recorder.options import parse_steps
    if args.stack_depth < 1:
        raise UsageError(f"--stack-depth must be at least 1 (got {args.stack_depth})")
    if args.timeout is not None and not 0 < args.timeout < float("inf"):
        raise UsageError(f"--timeout must be a positive number of seconds (got {args.timeout:g})")
    try:
        parse_steps(args.steps)
    except ValueError as exc:
        raise UsageError(f"--steps: {exc}") from None
    check_library(args.library_specs)


def check_library(specs: list[str]) -> None:
    """Every --library / --no-library name is an installed package (found, not imported)."""
    from tracer.vocab.library import LibrarySpecError, package_roots, parse_specs
    try:
        for name, _ in parse_specs(specs):
            package_roots(name)
    except LibrarySpecError as exc:
        raise UsageError(f"--library / --no-library: {exc}") from None
