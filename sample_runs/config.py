"""Command-line flags of the reference GPT and the checks that reject impossible layouts
before any process group exists (so every rank fails fast with the same one-line message)."""
from __future__ import annotations

import argparse
import sys
from dataclasses import asdict, dataclass
from typing import Optional

from sample_runs.data import BYTE_VOCAB
from sample_runs.model import GPTConfig
from sample_runs.parallel.pp_schedules import SCHEDULES




class ConfigError(ValueError):
    """An impossible configuration; the message is printed as one line."""


@dataclass(frozen=True)
class RunConfig:
    model: GPTConfig
    tp: int
    sp: bool
    pp: int
    dp: int
    schedule: str
    virtual_stages: int
    microbatches: int
    micro_batch_size: int
    steps: int
    seed: int
    lr: float
    bucket_size: int
    dump: Optional[str]
    dump_grads: bool

    def tracer_config(self) -> dict:
        """The fields of tracer.record_config."""
        m = self.model
        return dict(tp=self.tp, sp=self.sp, pp=self.pp, dp=self.dp, schedule=self.schedule,
                    microbatches=self.microbatches, virtual_stages=self.virtual_stages,
                    layers=m.layers, hidden=m.hidden, heads=m.heads, seq_len=m.seq_len,
                    vocab=m.vocab, micro_batch_size=self.micro_batch_size, steps=self.steps)

    def as_dict(self) -> dict:
        return {**asdict(self), "model": asdict(self.model)}


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    p = _OneLineParser(prog="python -m sample_runs.train",
                       description="Train the reference GPT with TP, SP, PP and DP.")
    p.add_argument("--tp", type=int, default=2, help="tensor-parallel size")
    p.add_argument("--sp", action=argparse.BooleanOptionalAction, default=True,
                   help="sequence parallelism on the TP group (default on)")
    p.add_argument("--pp", type=int, default=2, help="pipeline stages")
    p.add_argument("--dp", type=int, default=None, help="data-parallel size (default world/(tp*pp))")
    p.add_argument("--schedule", choices=sorted(SCHEDULES), default="1f1b")
    p.add_argument("--virtual-stages", type=int, default=1,
                   help="model chunks per pipeline rank (interleaved schedule, >= 2)")
    p.add_argument("--microbatches", type=int, default=4, help="micro-batches per iteration per DP rank")
    p.add_argument("--micro-batch-size", type=int, default=2)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--vocab", type=int, default=BYTE_VOCAB,
                   help="embedding rows, >= 256 (byte tokens; pad to divide by --tp)")
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--bucket-size", type=int, default=16384,
                   help="elements per data-parallel gradient bucket")
    p.add_argument("--dump", metavar="FILE", help="write losses (JSON) to FILE")
    p.add_argument("--dump-grads", action="store_true",
                   help="with --dump, also write step-1 gradients as full tensors to FILE.grads.npz")
    return p


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def parse_config(argv: Optional[list[str]], *, world_size: int) -> RunConfig:
    """Parse flags and reject configurations that cannot run on ``world_size`` ranks."""
    a = build_parser().parse_args(argv)
    for flag in ("tp", "pp", "dp", "virtual_stages", "microbatches", "micro_batch_size",
                 "layers", "hidden", "heads", "seq_len", "steps", "bucket_size"):
        value = getattr(a, flag)
        _check(value is None or value >= 1, f"--{flag.replace('_', '-')} must be >= 1, got {value}")
    _check(0.0 <= a.dropout < 1.0, f"--dropout must be in [0, 1), got {a.dropout}")
    model_parallel = a.tp * a.pp
    if a.dp is None:
        _check(world_size % model_parallel == 0,
               f"world size {world_size} is not a multiple of tp {a.tp} x pp {a.pp}"
               + (" (run under torchrun, or pass --tp 1 --pp 1)" if world_size == 1 else ""))
        a.dp = world_size // model_parallel
    _check(a.tp * a.dp * a.pp == world_size,
           f"world size {world_size} != tp {a.tp} x dp {a.dp} x pp {a.pp}")
    _check(a.vocab >= BYTE_VOCAB, f"--vocab must be >= {BYTE_VOCAB} (byte tokens), got {a.vocab}")
    _check(a.hidden % a.heads == 0, f"--hidden {a.hidden} is not divisible by --heads {a.heads}")
    for name in ("heads", "hidden", "vocab"):
        _check(getattr(a, name) % a.tp == 0,
               f"--tp {a.tp} does not divide --{name} {getattr(a, name)}")
    _check(not a.sp or a.seq_len % a.tp == 0,
           f"--sp needs --seq-len divisible by --tp: {a.seq_len} % {a.tp} != 0")
    if a.schedule == "interleaved":
        _check(a.virtual_stages >= 2, "--schedule interleaved needs --virtual-stages >= 2")
        _check(a.pp >= 2, "--schedule interleaved needs --pp >= 2")
        _check(a.microbatches % a.pp == 0,
               f"--schedule interleaved needs --microbatches divisible by --pp: "
               f"{a.microbatches} % {a.pp} != 0")
    else:
        _check(a.virtual_stages == 1,
               f"--virtual-stages {a.virtual_stages} needs --schedule interleaved")
    stages = a.pp * a.virtual_stages
    _check(a.layers % stages == 0,
           f"--layers {a.layers} is not divisible by pp x virtual stages = {stages}")
    _check(not a.dump_grads or a.dump is not None, "--dump-grads needs --dump FILE")
    model = GPTConfig(layers=a.layers, hidden=a.hidden, heads=a.heads, seq_len=a.seq_len,
                      vocab=a.vocab, dropout=a.dropout)
    return RunConfig(model=model, tp=a.tp, sp=a.sp, pp=a.pp, dp=a.dp, schedule=a.schedule,
                     virtual_stages=a.virtual_stages, microbatches=a.microbatches,
                     micro_batch_size=a.micro_batch_size, steps=a.steps, seed=a.seed, lr=a.lr,
                     bucket_size=a.bucket_size, dump=a.dump, dump_grads=a.dump_grads)
