"""The run goes on, across ranks (tracer/recorder/passthrough.py): on two gloo ranks training
DDP, rank 1's recorder fails at step 2 while recording a gradient all-reduce. Both ranks finish
with the losses and parameters of the same training untraced, bit for bit; rank 1's trace says
why and stops at that step, rank 0's records every step. The faults one by one, on both hot
paths: tests/unit/test_recorder_faults.py."""
from __future__ import annotations

import json

import tracer
from support.gpt_helpers import launch
from support.paths import SCRIPTS


def test_a_rank_whose_recorder_fails_trains_on_as_untraced(tmp_path):
    done = launch(2, [str(tmp_path)], script=str(SCRIPTS / "recorder_fault_ddp.py"))
    assert done.returncode == 0, done.stderr[-4000:]
    for rank in (0, 1):
        got = json.loads((tmp_path / f"losses-{rank}.json").read_text())
        assert got["traced"] == got["untraced"] and got["same_params"], rank
    traces = {r: tracer.load(tmp_path / f"rank-{r}.arrow") for r in (0, 1)}
    assert traces[1].meta["recorder_error"] == {
        "error": "RuntimeError: planted in comm.launch", "step": 2}
    assert "recorder_error" not in traces[0].meta
    assert all(t.status == "ok" for t in traces.values())
    steps = {r: {e["step"] for e in t.records()} for r, t in traces.items()}
    assert steps[0] == {0, 1, 2, 3, 4} and steps[1] == {0, 1, 2}
    assert done.stderr.count("paratrace: rank 1: the recorder failed at step 2 "
                             "(RuntimeError: planted in comm.launch)") == 1
