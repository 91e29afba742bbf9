"""``trace-whatif``: predict other parallel configurations of a recorded run.

    trace-whatif RUN [--out DIR] [--tp N] [--sp | --no-sp] [--pp N] [--dp N]
                 [--schedule S] [--virtual-stages V] [--microbatches M]
                 [--shard S] [--shard-units P] [--param-dtype D] [--checkpoint P]
                 [--no-checkpoint] [--microbatch-size N] [--grad-accum N] [--tp-plan FILE]
                 [--split PATTERN] [--target "OPTIONS"]...

The options given directly are one target; each ``--target "OPTIONS"`` (the same option names) is
another; with none, only the replay is predicted. Every target changes only what it names from the
recorded configuration (viz.whatif.reference_gpt.targets, viz.whatif.model_targets). Open the run
-> analyse it once -> (for targets on any model, each rank's step detail) -> replay and predict
(viz.whatif) -> the renderers of :mod:`viz.render.whatif`: with ``--out DIR`` DIR/whatif/*.svg,
DIR/whatif.json and DIR/whatif.html, and the page's path on stdout; without it the ranking on
stdout and no file (as trace-diff without --out: a table, no file). Bad options and targets that
cannot be predicted are one line on stderr and exit status 2.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from typing import Optional

from tracer.vocab.console_errors import CommandParser as _Parser
from tracer.vocab.console_errors import run_console

EXIT_USAGE = 2
PROG = "trace-whatif"
SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1")
SHARDINGS = ("replicate", "optimizer", "gradients", "full")
KEYS = ("tp", "sp", "pp", "dp", "schedule", "virtual_stages", "microbatches", "shard",
        "shard_units", "param_dtype", "checkpoint", "no_checkpoint", "microbatch_size",
        "grad_accum", "tp_plan", "split")


class _UsageError(Exception):
    pass


def _whole(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}")
    return value


def _target_options(parser: argparse.ArgumentParser) -> None:
    """The reference GPT's option names (python -m sample_runs.train --help)."""
    parser.add_argument("--tp", type=_whole, help="tensor-parallel size")
    parser.add_argument("--sp", action=argparse.BooleanOptionalAction, default=None,
                        help="sequence parallelism on the TP group")
    parser.add_argument("--pp", type=_whole, help="pipeline stages")
    parser.add_argument("--dp", type=_whole, help="data-parallel size (default: the recorded "
                        "world over tp x pp; naming it predicts a world of tp x pp x dp)")
    parser.add_argument("--schedule", choices=SCHEDULES, help="pipeline schedule")
    parser.add_argument("--virtual-stages", type=_whole,
                        help="model chunks per pipeline rank (interleaved)")
    parser.add_argument("--microbatches", type=_whole, help="micro-batches per iteration")
    # on any model (docs/whatif.md): PATTERNs match module paths of the unwrapped model
    parser.add_argument("--shard", choices=SHARDINGS, help="data-parallel sharding: DDP, "
                        "ZeRO-1, ZeRO-2 or FSDP2's full sharding")
    parser.add_argument("--shard-units", metavar="PATTERN",
                        help="FSDP2's units (default: the repeated blocks, and the root)")
    parser.add_argument("--param-dtype", choices=("bf16", "fp16", "fp32"),
                        help="FSDP2's mixed precision (MixedPrecisionPolicy.param_dtype)")
    parser.add_argument("--checkpoint", metavar="PATTERN",
                        help="checkpoint these modules (non-reentrant), no other")
    parser.add_argument("--no-checkpoint", action="store_const", const=True, default=None,
                        help="checkpoint no module")
    parser.add_argument("--microbatch-size", type=_whole, help="samples per micro-batch")
    parser.add_argument("--grad-accum", type=_whole,
                        help="micro-batches per optimizer step (gradient accumulation)")
    parser.add_argument("--tp-plan", type=_plan, metavar="FILE", help="with --tp, on any model: "
                        "a JSON object of module PATTERN -> colwise | rowwise")
    parser.add_argument("--split", metavar="PATTERN", help="with --pp, on any model: the "
                        "modules where pipeline stages begin (torch.distributed.pipelining)")


def _plan(path: str) -> dict:
    """A TP plan file: a JSON object of module PATTERN -> colwise | rowwise."""
    try:
        with open(path, encoding="utf-8") as fh:
            plan = json.load(fh)
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"{path}: {exc.strerror}") from None
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{path}: not JSON ({exc})") from None
    if not isinstance(plan, dict) or not plan or \
            not all(isinstance(v, str) for v in plan.values()):
        raise argparse.ArgumentTypeError(f"{path}: not a JSON object of module PATTERN -> "
                                         "colwise | rowwise")
    return plan


def _changes(args: argparse.Namespace) -> dict:
    return {k: getattr(args, k) for k in KEYS if getattr(args, k) is not None}


def parse(argv) -> tuple:
    """(run dir, out dir, jobs, targets): each target option -> value."""
    parser = _Parser(prog=PROG, description="Predict the step time, bubble and exposed "
                     "communication of other parallel configurations from one recording "
                     "(docs/whatif.md).")
    parser.add_argument("run_dir", help="a traced run (trace-run's --out directory)")
    parser.add_argument("--out", help="where to write whatif.json, whatif.html and the "
                        "predicted timelines (without it, only the ranking is printed)")
    _target_options(parser)
    parser.add_argument("--target", action="append", default=[], metavar='"OPTIONS"',
                        help='another target, e.g. --target "--schedule gpipe" (repeatable)')
    parser.add_argument("--jobs", type=_whole, default=None, metavar="N",
                        help="analyse ranks in N worker processes")
    args = parser.parse_args(_joined(sys.argv[1:] if argv is None else list(argv)))
    targets = [_changes(args)] if _changes(args) else []
    one = _Parser(prog=f"{PROG} --target", add_help=False)
    _target_options(one)
    for text in args.target:
        try:
            words = shlex.split(text)
        except ValueError as exc:
            raise _UsageError(f"--target {text!r}: {exc}") from None
        found = _changes(one.parse_args(words))
        if not found:
            raise _UsageError(f"--target {text!r} names no option")
        targets.append(found)
    return args.run_dir, args.out, args.jobs, targets


def _joined(argv: list) -> list:
    """``--target --no-checkpoint`` as ``--target=--no-checkpoint``: argparse takes a lone
    word that starts with ``-`` for an option, not for --target's value."""
    out, words = [], iter(argv)
    for word in words:
        following = next(words, None) if word == "--target" else None
        if following is not None and following.startswith("-") and " " not in following:
            out.append(f"--target={following}")
        else:
            out += [word] + ([following] if following is not None else [])
    return out


def main(argv: Optional[list] = None) -> int:
    try:
        run_dir, report_dir, jobs, targets = parse(argv)
    except _UsageError as exc:
        return _fail(str(exc))
    from tracer.files.format import TraceError

    from .run import RunError
    from .whatif import SimulationError, TargetError
    try:
        index = run(run_dir, report_dir, targets, jobs)
    except (RunError, TraceError, TargetError, SimulationError) as exc:
        return _fail(str(exc))
    except OSError as exc:
        return _fail(f"{exc.filename}: {exc.strerror}" if exc.filename else str(exc))
    if index is not None:
        print(index, flush=True)
    return 0


def run(run_dir: str, report_dir: Optional[str], targets: list,
        jobs: Optional[int] = None) -> Optional[str]:
    """Open -> analyse -> replay and predict -> the renderers; returns whatif.html's path
    (None without ``report_dir``: the ranking only, on stdout)."""
    from .analysis import analyse
    from .engine import Engine
    from .render import render_all
    from .render.whatif import FILES, PAGE, TERMINAL, WhatIfInput
    from .run import RunError, open_run
    from .whatif import what_if
    from .whatif.model_targets import is_model_target
    run = open_run(run_dir)
    if report_dir is not None:
        try:
            os.makedirs(os.path.join(report_dir, "whatif"), exist_ok=True)
        except OSError as exc:
            raise RunError(f"{report_dir}: cannot create the output directory "
                           f"({exc.strerror})") from None
    with Engine(jobs) as engine:
        analysis = analyse(run, engine)
        gpt = _reference_gpt(analysis.config)
        if any(is_model_target(t, gpt) for t in targets):
            details = step_details(analysis, engine)
        elif not gpt:        # rank 0's, without its storages: to say the recorded setup
            details = step_details(analysis, engine, first_only=True)
        else:
            details = None
    result = what_if(analysis, targets, details, run_dir)
    whatif = WhatIfInput(result, run_dir)
    if report_dir is None:
        render_all(TERMINAL, whatif, report_dir)
        return None
    render_all(FILES, whatif, report_dir)
    return os.path.join(report_dir, PAGE)


def _reference_gpt(config: dict) -> bool:
    from .whatif.reference_gpt.megatron import shape_of
    return shape_of(config) is not None


def step_details(analysis, engine, first_only: bool = False) -> dict:
    """rank -> its counted steps op by op (viz.analysis.step_detail), the last one's
    storages: each readable rank's trace read again, one rank per task (``first_only``:
    the first rank's, without storages)."""
    from .analysis.step_detail import step_detail_file
    ranks = [(r, mine) for r, mine in sorted(analysis.ranks.items()) if mine.counted_steps]
    ranks = ranks[:1] if first_only else ranks
    found = engine.map(step_detail_file, [
        (mine.path, r, tuple(mine.counted_steps),
         None if first_only else max(mine.counted_steps)) for r, mine in ranks])
    return {r: detail for (r, _), detail in zip(ranks, found)}


def _fail(message: str) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def console() -> int:
    """The ``trace-whatif`` console script: main, its bugs in one line."""
    return run_console("trace-whatif", main)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(console())
