"""Memory of the reference GPT recorded with ``trace-run --memory`` (2 gloo ranks, tiny sizes)
against numbers from elsewhere: what each ZeRO stage keeps (the GPT's own count of the tensors
it holds after step 1's optimizer step, sample_runs/dump.py) and the activations a pipeline's
stages hold at their peak under GPipe and 1F1B (docs/oracles.md, "Memory per rank": m against
min(m, p - r) micro-batches), and trace-whatif's GPipe peak predicted from the 1F1B run against
the real GPipe run (within 10 %)."""
from __future__ import annotations

import json

import numpy as np
import pytest

import tracer
from support.cli import trace_run
from tracer.files import rundir
from viz.analysis.memory import memory_profile
from viz.analysis import analyse
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
    # AdamW's exp_avg and exp_avg_sq, plus a 4-byte step tensor per parameter it updates
    assert held["optimizer_state"] <= live["optimizer_state"] <= 1.01 * held["optimizer_state"]
    if zero == "0":
        assert held["param_shards"] == 0 and live["optimizer_state"] < 1.01 * 2 * live[
            "parameters"]


def test_pipeline_stages_hold_m_against_min_m_p_minus_r_micro_batches(tmp_path):
    m, p = 4, 2
    peaks = {}
    for schedule in ("gpipe", "1f1b"):
        out = tmp_path / schedule
        _run(out, "--tp", "1", "--pp", str(p), "--schedule", schedule, "--microbatches",
             str(m), "--steps", "2")
        for rank in range(p):
            profile = _profile(out, rank)
            activations = profile.categories.index("activations")
            peaks[(schedule, rank)] = int(profile.live[profile.steps == 1, activations].max())
    for stage in range(p):
        ratio = peaks[("gpipe", stage)] / peaks[("1f1b", stage)]
        assert ratio == pytest.approx(m / min(m, p - stage), rel=0.01), (stage, peaks)
    # what-if: GPipe's peak per rank predicted from the 1F1B run, against the real GPipe run
    prediction = what_if(analyse(open_run(str(tmp_path / "1f1b"))),
                         [{"schedule": "gpipe"}]).targets[0]
    for rank in range(p):
        real = _profile(tmp_path / "gpipe", rank).peak_bytes
        assert prediction.memory[str(rank)]["peak_bytes"] == pytest.approx(real, rel=0.10)
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
