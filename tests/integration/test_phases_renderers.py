"""Every renderer draws every phase (graphviz; the unit checks: tests/unit/test_phases_report.py)."""
from __future__ import annotations

import json
from tracer.vocab.labels import PHASES
from support.constructed_timelines import phase_run


def test_summary_counts_ops_by_phase_and_every_renderer_draws_every_phase(tmp_path):
    from viz.cli import build
    run = phase_run(tmp_path / "run")
    index, _ = build(run, str(tmp_path / "report"), jobs=1)
    summary = json.loads((tmp_path / "report" / "summary.json").read_text())
    for rank in ("0", "1"):
        entry = summary["ranks"][rank]
        assert entry["op_counts_by_phase"] == {
            "forward": {"aten.mm.default": 2, "c10d._allgather_base_.default": 1},
            "backward": {"aten.mm.default": 1}, "recompute": {"aten.mm.default": 1},
            "grad_sync": {"c10d.allreduce_.default": 1},
            "optimizer": {"aten.mm.default": 1, "aten.add_.Tensor": 1},
            "other": {"aten.mm.default": 1}}
        assert list(entry["op_counts_by_phase"]) == list(PHASES)     # in code order
        total = {}
        for ops in entry["op_counts_by_phase"].values():
            for op, n in ops.items():
                total[op] = total.get(op, 0) + n
        assert total == entry["op_counts"]
        assert {(c["kind"], c["phase"]) for c in entry["comm"]} == {("all_reduce", "grad_sync"),
                                                                    ("all_gather", "forward")}
    svgs = "".join(p.read_text() for p in (tmp_path / "report").rglob("*.svg"))
    assert "#f3e5f5" in svgs and "#fff3e0" in svgs      # recompute and optimizer leaf fills
    assert "grad_sync" in svgs and "recompute" in svgs
