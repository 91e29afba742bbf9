"""Command-line flags of the reference GPT and the checks that reject impossible layouts
before any process group exists (so every rank fails fast with the same one-line message).

Which schemes compose (and why the others are rejected) is documented in
docs/reference-gpt.md, "Composing the schemes"."""
from __future__ import annotations

import argparse
import sys
from dataclasses import asdict, dataclass
from typing import Optional

from sample_runs.data import BYTE_VOCAB
from sample_runs.model import GPTConfig
from tracer.vocab.schedules import SCHEDULES

DEVICES = ("auto", "cpu", "cuda")


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
    cp: int = 1
    zero: int = 0
    ep: int = 1
    device: str = "auto"

    def tracer_config(self) -> dict:
        """The fields of tracer.record_config."""
        m = self.model
        return dict(tp=self.tp, sp=self.sp, pp=self.pp, dp=self.dp, schedule=self.schedule,
                    microbatches=self.microbatches, virtual_stages=self.virtual_stages,
                    layers=m.layers, hidden=m.hidden, heads=m.heads, seq_len=m.seq_len,
                    vocab=m.vocab, micro_batch_size=self.micro_batch_size, steps=self.steps,
                    cp=self.cp, zero=self.zero, ep=self.ep, moe_experts=m.moe_experts,
                    topk=m.moe_topk, capacity_factor=m.capacity_factor,
                    bucket_size=self.bucket_size)

    def as_dict(self) -> dict:
        return {**asdict(self), "model": asdict(self.model)}


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    p = _OneLineParser(prog="python -m sample_runs.train",
                       description="Train the reference GPT with TP, SP, CP, PP, DP, ZeRO and EP.")
    p.add_argument("--tp", type=int, default=2, help="tensor-parallel size")
    p.add_argument("--sp", action=argparse.BooleanOptionalAction, default=True,
                   help="sequence parallelism on the TP group (default on)")
    p.add_argument("--pp", type=int, default=2, help="pipeline stages")
    p.add_argument("--cp", type=int, default=1,
                   help="context-parallel size: the sequence split over cp ranks, ring attention")
    p.add_argument("--dp", type=int, default=None,
                   help="data-parallel size (default world/(tp*cp*pp))")
    p.add_argument("--zero", type=int, choices=(0, 1, 2, 3), default=0,
                   help="ZeRO stage over the DP (x CP) group: 0 plain DP, 1 optimizer state, "
                        "2 + gradients, 3 + parameters")
    p.add_argument("--moe-experts", type=int, default=0,
                   help="experts per MoE layer (0: dense MLPs)")
    p.add_argument("--ep", type=int, default=1,
                   help="expert-parallel size, carved out of the DP ranks")
    p.add_argument("--topk", type=int, default=2, help="experts per token (MoE router)")
    p.add_argument("--capacity-factor", type=float, default=1.25,
                   help="expert capacity = ceil(factor * tokens * topk / experts) per micro-batch")
    p.add_argument("--aux-loss-coeff", type=float, default=0.01,
                   help="weight of the Switch load-balancing loss of each MoE layer")
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
    p.add_argument("--device", choices=DEVICES, default="auto",
                   help="auto: CUDA + NCCL when every local rank gets its own GPU, else CPU + gloo")
    return p


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


def parse_config(argv: Optional[list[str]], *, world_size: int) -> RunConfig:
    """Parse flags and reject configurations that cannot run on ``world_size`` ranks."""
    a = build_parser().parse_args(argv)
    for flag in ("tp", "pp", "dp", "cp", "ep", "topk", "virtual_stages", "microbatches",
                 "micro_batch_size", "layers", "hidden", "heads", "seq_len", "steps",
                 "bucket_size"):
        value = getattr(a, flag)
        _check(value is None or value >= 1, f"--{flag.replace('_', '-')} must be >= 1, got {value}")
    _check(0.0 <= a.dropout < 1.0, f"--dropout must be in [0, 1), got {a.dropout}")
    model_parallel = a.tp * a.cp * a.pp
    cp_text = f" x cp {a.cp}" if a.cp > 1 else ""
    if a.dp is None:
        _check(world_size % model_parallel == 0,
               f"world size {world_size} is not a multiple of tp {a.tp}{cp_text} x pp {a.pp}"
               + (" (run under torchrun, or pass --tp 1 --pp 1)" if world_size == 1 else ""))
        a.dp = world_size // model_parallel
    _check(a.tp * a.cp * a.dp * a.pp == world_size,
           f"world size {world_size} != tp {a.tp}{cp_text} x dp {a.dp} x pp {a.pp}")
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
    _check_context_parallel(a)
    _check_zero(a)
    _check_experts(a)
    model = GPTConfig(layers=a.layers, hidden=a.hidden, heads=a.heads, seq_len=a.seq_len,
                      vocab=a.vocab, dropout=a.dropout, moe_experts=a.moe_experts,
                      moe_topk=a.topk, capacity_factor=a.capacity_factor,
                      aux_loss_coeff=a.aux_loss_coeff)
    return RunConfig(model=model, tp=a.tp, sp=a.sp, pp=a.pp, dp=a.dp, schedule=a.schedule,
                     virtual_stages=a.virtual_stages, microbatches=a.microbatches,
                     micro_batch_size=a.micro_batch_size, steps=a.steps, seed=a.seed, lr=a.lr,
                     bucket_size=a.bucket_size, dump=a.dump, dump_grads=a.dump_grads, cp=a.cp,
                     zero=a.zero, ep=a.ep, device=a.device)


def _check_context_parallel(a: argparse.Namespace) -> None:
    if a.cp == 1:
        return
    _check(a.seq_len % (2 * a.cp) == 0,
           f"--cp {a.cp} splits the sequence into 2 x cp chunks: --seq-len {a.seq_len} "
           f"is not divisible by {2 * a.cp}")
    _check(not a.sp or (a.seq_len // a.cp) % a.tp == 0,
           f"--sp with --cp {a.cp} needs --seq-len / cp divisible by --tp: "
           f"{a.seq_len // a.cp} % {a.tp} != 0")


def _check_zero(a: argparse.Namespace) -> None:
    if a.zero == 0:
        return
    _check(a.moe_experts == 0,
           f"--zero {a.zero} with --moe-experts is not supported (expert weights would need "
           "their own sharding over the expert-data-parallel group)")
    _check(a.zero < 3 or a.schedule != "zb-h1",
           "--zero 3 with --schedule zb-h1 is not supported: ZeRO-3 frees and reduce-scatters "
           "a layer when autograd has accumulated its gradients, and zb-h1 accumulates the "
           "weight gradients later, in W passes")


def _check_experts(a: argparse.Namespace) -> None:
    _check(a.moe_experts >= 0, f"--moe-experts must be >= 0, got {a.moe_experts}")
    if a.moe_experts == 0:
        _check(a.ep == 1, f"--ep {a.ep} needs --moe-experts")
        return
    _check(a.topk <= a.moe_experts,
           f"--topk {a.topk} is more than --moe-experts {a.moe_experts}")
    _check(a.capacity_factor > 0, f"--capacity-factor must be > 0, got {a.capacity_factor}")
    _check(a.aux_loss_coeff >= 0, f"--aux-loss-coeff must be >= 0, got {a.aux_loss_coeff}")
    _check(a.moe_experts % a.ep == 0,
           f"--ep {a.ep} does not divide --moe-experts {a.moe_experts}")
    _check(a.dp % a.ep == 0,
           f"--ep {a.ep} is carved out of the data-parallel ranks: it must divide dp {a.dp}")
    _check(a.cp == 1,
           "--moe-experts with --cp > 1 is not supported: expert capacity is counted over a "
           "micro-batch's tokens, which CP would split")
    _check(a.tp == 1 or not a.sp,
           "--moe-experts with --tp > 1 needs --no-sp: the TP ranks then route the same "
           "tokens (experts are not tensor-parallel)")
