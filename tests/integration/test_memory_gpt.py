"""Memory of the reference GPT recorded with ``trace-run --memory`` (2 gloo ranks, tiny sizes)
against numbers from elsewhere: what each ZeRO stage keeps (the GPT's own count of the tensors
it holds after step 1's optimizer step, sample_runs/dump.py), each transformer block's
activations per micro-batch (Korthikanti et al.'s count) and the parameters tensor parallelism
leaves a rank (Megatron's rules), the block passes a pipeline's stages hold at their peak under
GPipe, 1F1B, ZB-H1 and interleaved 1F1B (docs/oracles.md, "Memory per rank"), and
trace-whatif's peaks for those schedules predicted from the 1F1B run against the real runs
(within 2 %)."""
from __future__ import annotations

import json

import numpy as np
import pytest

import tracer
from support.cli import trace_run
from support.gpt_memory import activations_at_their_peak, activations_per_block_pass
from tracer.files import rundir
from viz.analysis import analyse
from viz.analysis.memory.live_bytes import memory_profile
from viz.cli import report_main
from viz.run import open_run
from viz.whatif import what_if

pytestmark = pytest.mark.integration

FLOAT = 4
TINY = ["--layers", "2", "--hidden", "32", "--heads", "4", "--seq-len", "16"]


def _run(out, *flags) -> None:
    proc = trace_run("--memory", "--nproc-per-node", "2", "--out", out, "--no-report", "-m",
                     "sample_runs.train", *TINY, *flags, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]


def _profile(out, rank: int):
    return memory_profile(tracer.load(rundir.trace_file(str(out / "traces"), rank)))


@pytest.mark.parametrize("zero", ["0", "1", "2", "3"])
def test_each_zero_stage_keeps_what_the_gpt_counts_it_holds(tmp_path, zero):
    out, dump = tmp_path / "run", tmp_path / "dump.json"
    _run(out, "--tp", "1", "--pp", "1", "--dp", "2", "--zero", zero, "--microbatches", "1",
         "--steps", "2", "--dump", dump)
    held = {k: FLOAT * v for k, v in json.loads(dump.read_text())["memory"].items()}
    profile = _profile(out, 0)                    # the rank that dumped
    end = np.flatnonzero(profile.steps == 1)[-1]  # the last memory event of step 1
    live = dict(zip(profile.categories, profile.live[end].tolist()))
    # ZeRO-3 frees the model's parameters with resize_(0): only the shards stay
    assert live["parameters"] == held["model_params"] + held["param_shards"]
    assert live["gradients"] == held["model_grads"] + held["grad_shards"]
    # AdamW's exp_avg and exp_avg_sq, and its 4-byte step tensor per parameter it updates
    assert live["optimizer_state"] == held["optimizer_state"] + held["optimizer_steps"]
    if zero == "0":       # the moments of every parameter, the same dtype
        assert held["param_shards"] == 0 and held["optimizer_state"] == 2 * live["parameters"]


SIZES = {"layers": 4, "hidden": 32, "heads": 4, "seq_len": 16, "micro_batch_size": 2,
         "vocab": 256}                     # TINY with 4 layers; the GPT's default b and vocab


def _block_bytes(tp: int, sp: bool) -> int:
    """One transformer block's activations for one micro-batch, fp32, the reference GPT
    (pre-LN, fused attention, no dropout): Korthikanti et al.'s s b h (10 + 24/t) fp16 bytes
    (s b h 34/t with SP) less the two sbh dropout masks, in elements (halve the fp16 bytes):
    ln1 out, x + attn, ln2 out and the block's output (each s[/t] b h), qkv out 3 s b h/t,
    attention out s b h/t, fc1 and GELU out 4 s b h/t each; plus each LayerNorm's mean and
    rstd (s[/t] b) and the fused attention's log-sum-exp (b a/t s) it keeps instead of the
    5 a s^2 b scores."""
    s, b, h, a = SIZES["seq_len"], SIZES["micro_batch_size"], SIZES["hidden"], SIZES["heads"]
    sbh = s * b * h
    if sp:
        elements = 16 * sbh // tp + 4 * s * b // tp + b * a // tp * s
    else:
        elements = sbh * 4 + 12 * sbh // tp + 4 * s * b + b * a // tp * s
    return FLOAT * elements


def _parameters(tp: int) -> int:
    """Bytes of one rank's parameters, pp 1 (Megatron's rules, docs/oracles.md): the
    vocab-parallel embedding V h/t, positions s h, per block the column-parallel qkv and fc1
    (weights and biases / t), the row-parallel proj and fc2 (weights / t, biases whole) and two
    LayerNorms, the final LayerNorm; the head's weight is the embedding's."""
    h, s, v, layers = SIZES["hidden"], SIZES["seq_len"], SIZES["vocab"], SIZES["layers"]
    block = (3 * h * h + 3 * h + h * h + 4 * h * h + 4 * h + 4 * h * h) // tp + 2 * h + 4 * h
    return FLOAT * (v * h // tp + s * h + layers * block + 2 * h)


@pytest.mark.parametrize("tp,sp", [(1, False), (2, True), (2, False)],
                         ids=["tp1", "tp2-sp", "tp2"])
def test_each_block_keeps_korthikanti_bytes_and_tp_divides_parameters(tmp_path, tp, sp):
    out, m = tmp_path / "run", 2
    _run(out, "--layers", str(SIZES["layers"]), "--tp", str(tp), "--pp", "1", "--dp",
         str(2 // tp), "--sp" if sp else "--no-sp", "--microbatches", str(m), "--steps", "2")
    for rank in range(2):
        kept = activations_per_block_pass(out, rank, step=1)
        assert kept == {(i, mb): _block_bytes(tp, sp) for i in range(SIZES["layers"])
                        for mb in range(m)}, (rank, kept)
        profile = _profile(out, rank)
        end = np.flatnonzero(profile.steps == 1)[-1]
        live = dict(zip(profile.categories, profile.live[end].tolist()))
        assert live["parameters"] == live["gradients"] == _parameters(tp)


def _in_flight(schedule: str, m: int, p: int, v: int, r: int) -> tuple:
    """(full, pending) block passes stage r holds when its activations peak: micro-batch chunks in flight (GPipe m; 1F1B and ZB-H1 min(m, p - r); interleaved
    min(m v, 2 (p - r - 1) + (v - 1) p + 1), Narayanan et al. 2021), each chunk's layers; and
    ZB-H1's W passes pending, min(r, m - p + r) micro-batches (tracer.vocab.schedules.zb_h1
    runs stage r's W up to r micro-batches late; Qi et al. 2023)."""
    v = v if schedule == "interleaved" else 1
    layers = SIZES["layers"] // (p * v)
    chunks = {"gpipe": m, "1f1b": min(m, p - r), "zb-h1": min(m, p - r),
              "interleaved": min(m * v, 2 * (p - r - 1) + (v - 1) * p + 1)}[schedule]
    pending = min(r, m - p + r) if schedule == "zb-h1" else 0
    return chunks * layers, pending * layers


def test_pipeline_stages_hold_the_micro_batches_each_schedule_keeps(tmp_path):
    m, p, v = 4, 2, 2
    sbh = SIZES["seq_len"] * SIZES["micro_batch_size"] * SIZES["hidden"]
    peaks = {}
    for schedule in ("gpipe", "1f1b", "zb-h1", "interleaved"):
        out = tmp_path / schedule
        chunks = ["--virtual-stages", str(v)] if schedule == "interleaved" else []
        _run(out, "--layers", str(SIZES["layers"]), "--tp", "1", "--pp", str(p), "--schedule",
             schedule, *chunks, "--microbatches", str(m), "--steps", "2")
        for rank in range(p):
            whole = activations_per_block_pass(out, rank, step=1)
            held = activations_at_their_peak(out, rank, step=1)
            full = [k for k, b in held.items() if b == whole[k]]
            # a pending W pass keeps its four linear layers' inputs: ln1 out, attention out,
            # ln2 out (s b h each) and GELU out (4 s b h)
            pending = [k for k, b in held.items() if b == FLOAT * 7 * sbh]
            assert len(full) + len(pending) == len(held), (schedule, rank, held)
            assert (len(full), len(pending)) == _in_flight(schedule, m, p, v, rank), \
                (schedule, rank, held)
            profile = _profile(out, rank)
            activations = profile.categories.index("activations")
            peaks[(schedule, rank)] = int(profile.live[profile.steps == 1, activations].max())
    # GPipe holds m micro-batches, 1F1B min(m, p - stage): their peaks in that ratio, to the
    # byte, once the first stage's token ids are set apart (it splits the step's batch into m
    # micro-batches of b rows of s + 1 int64 tokens at the step's start, whatever the schedule)
    tokens = m * SIZES["micro_batch_size"] * (SIZES["seq_len"] + 1) * 8
    for stage in range(p):
        once = tokens if stage == 0 else 0
        assert (peaks[("gpipe", stage)] - once) * min(m, p - stage) == \
            (peaks[("1f1b", stage)] - once) * m, (stage, peaks)
    # what-if: each schedule's peak per rank predicted from the 1F1B run, against its real run
    # (the bytes are deterministic: the worst error measured, 2026-11-28, was 1.5%: ZB-H1 and
    # interleaved 1F1B, whose W passes and chunks the prediction models apart)
    targets = [{"schedule": "gpipe"}, {"schedule": "zb-h1"},
               {"schedule": "interleaved", "virtual_stages": v}]
    predictions = what_if(analyse(open_run(str(tmp_path / "1f1b"))), targets).targets
    for target, prediction in zip(targets, predictions):
        for rank in range(p):
            real = _profile(tmp_path / target["schedule"], rank).peak_bytes
            assert prediction.memory[str(rank)]["peak_bytes"] == pytest.approx(real, rel=0.02), \
                (target, rank)
    # the report: summary.json's memory per rank, the front page's peaks, the rank's page
    out = tmp_path / "1f1b"
    assert report_main([str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    for rank in range(p):
        mem, profile = summary["ranks"][str(rank)]["memory"], _profile(out, rank)
        assert mem["peak_bytes"] == profile.peak_bytes == sum(mem["by_category"].values())
        assert mem["category_peaks"]["activations"] >= peaks[("1f1b", rank)]
        assert sum(mem["by_phase"].values()) == mem["peak_bytes"]
    assert "Memory at each rank's peak" in (out / "index.html").read_text()
    svg = (out / "timeline.svg").read_text()       # the timeline's memory lane, every rank
    assert all(f"<title>rank {r} activations: at most" in svg for r in range(p))
    assert "Memory at its peak" in (out / "ranks" / "rank-0.html").read_text()
