"""The timeline of the reference GPT traced by trace-run (real torchrun, gloo, 2 ranks).

Real runs assert what load cannot change: passes and their order, micro-batches and chunks,
matched messages, the schedule's theory, where collectives are launched, what is drawn. How
long anything took is tested on constructed traces (test_timeline.py); measured bubbles
against the theory are a benchmark (benchmarks/bubbles.py, numbers in docs/metrics.md).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from support.chrome_trace_checks import check_chrome_trace, check_op_args
from support.cli import CPU_ONLY
from support.gpt_helpers import free_port
from viz.analysis import analyse
from viz.render.report import ReportInput, timeline
from viz.run import open_run

MODEL = ["--tp", "1", "--layers", "4", "--hidden", "32", "--heads", "4", "--seq-len", "16",
         "--micro-batch-size", "2", "--steps", "3"]
M = 4


def trace_gpt(tmp_path_factory, name: str, *args: str):
    """Trace the reference GPT with trace-run (steps 1- recorded); returns its analysis."""
    out = tmp_path_factory.mktemp(name) / "run"
    env = dict(os.environ, OMP_NUM_THREADS="1", **CPU_ONLY)
    cmd = [sys.executable, "-m", "instrument.launch", "--nproc-per-node", "2",
           "--master-port", str(free_port()), "--out", str(out), "--steps", "1-",
           "--no-report", "-m", "sample_runs.train", *MODEL, *args]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return analyse(open_run(str(out)))


@pytest.fixture(scope="module")
def gpipe(tmp_path_factory):
    return trace_gpt(tmp_path_factory, "gpipe", "--pp", "2", "--schedule", "gpipe",
                     "--microbatches", str(M))


def test_gpipe_passes_come_from_annotations_per_microbatch(gpipe):
    tl = gpipe.timeline
    for rank, lane in tl.ranks.items():
        for step in gpipe.metrics[rank].counted_steps:
            got = [(p.kind, p.microbatch) for p in lane.passes if p.step == step]
            assert got == [("F", i) for i in range(M)] + [("B", i) for i in range(M)]
        assert all(p.source == "annotation" for p in lane.passes)
    stepped = {p.step for p in tl.ranks[0].passes}
    assert stepped == {1, 2}
    assert len(tl.links) == 2 * M * len(stepped)   # an F and a B message per micro-batch


def test_gpipe_theory_and_bubble_sections(gpipe):
    for rank in (0, 1):
        m = gpipe.metrics[rank]
        assert m.theoretical_bubble_fraction == pytest.approx(0.2)      # (p-1)/(m+p-1)
        p = m.pipeline
        assert 0 <= p.bubble_fraction <= 1
        assert p.warmup_fraction + p.steady_fraction + p.cooldown_fraction == \
            pytest.approx(p.bubble_fraction)
        assert p.steady_fraction == pytest.approx(0.0)   # GPipe has no 1F1B phase
        assert p.simulated_bubble_fraction is not None


def test_interleaved_passes_name_their_chunk(tmp_path_factory):
    inter = trace_gpt(tmp_path_factory, "interleaved", "--pp", "2", "--schedule", "interleaved",
                      "--virtual-stages", "2", "--microbatches", str(M))
    assert inter.metrics[0].theoretical_bubble_fraction == pytest.approx(1 / 9)
    for lane in inter.timeline.ranks.values():
        step = [p for p in lane.passes if p.step == 1]
        assert sorted((p.kind, p.microbatch, p.chunk) for p in step) == sorted(
            (k, i, c) for k in "FB" for i in range(M) for c in (0, 1))
    # v*p - 1 = 3 boundaries, an F and a B message per micro-batch each, per step
    assert len(inter.timeline.links) == 2 * 3 * M * 2


def test_dp_bucketed_all_reduce_is_launched_during_backward(tmp_path_factory):
    """Gradient buckets go out from autograd hooks while backward still runs: in every
    counted step some all-reduce starts before the rank's last backward pass ends."""
    run = trace_gpt(tmp_path_factory, "dp", "--pp", "1", "--dp", "2", "--bucket-size", "2000")
    for rank, lane in run.timeline.ranks.items():
        for step in run.metrics[rank].counted_steps:
            reduces = [c for c in lane.comm if c.kind == "all_reduce" and c.step == step]
            assert len(reduces) > 1 and all(c.completed for c in reduces)
            backward = [p for p in lane.passes if p.step == step and p.kind == "B"]
            assert backward, "DP passes are annotated"
            assert min(c.start for c in reduces) < max(p.end for p in backward)
        assert run.metrics[rank].pipeline is None


def test_write_timeline_of_a_real_run(gpipe, tmp_path):
    timeline.render(ReportInput(gpipe), str(tmp_path))
    files = ReportInput.TIMELINE_FILES
    root = ET.parse(tmp_path / files["svg"]).getroot()
    titles = [t.text for t in root.iter("{http://www.w3.org/2000/svg}title")]
    assert any(t.startswith(f"rank 1 B micro-batch {M - 1}") for t in titles)
    events = json.loads((tmp_path / files["chrome_trace"]).read_text())["traceEvents"]
    # a flow per P2P link and per collective matched across ranks; args on every op
    collectives = [m for m in gpipe.cross.matched if len(m.spans) > 1]
    check_chrome_trace(events, expected_flows=len(gpipe.timeline.links) + len(collectives))
    check_op_args(events)
