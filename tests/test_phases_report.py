"""Every phase through the analyses and renderers, on a constructed 2-rank run with known ops:
summary.json's op_counts_by_phase and comm rows, the full report (call graphs with the phase
fills, module view, timeline) and trace-diff, without a crash. Also: traces of format 1 (phases
0-2 only) still read."""
from __future__ import annotations

import json

from tracer.vocab.labels import PHASES
from constructed.synthetic import SyntheticRank, write_run

SITE = [("/src/train.py", 10, "step", "step")]


def phase_run(directory, extra_recompute: int = 0):
    ranks = []
    for rank in range(2):
        r = SyntheticRank(rank, 2)
        r.next_step(0)
        t = 1
        for phase in ("forward", "forward", "backward", "recompute", "optimizer", "other"):
            r.op(t, t + 1, "aten.mm.default", phase=phase, stack=SITE, module="Net.a")
            t += 2
        for _ in range(extra_recompute):
            r.op(t, t + 1, "aten.mm.default", phase="recompute", stack=SITE, module="Net.a")
            t += 2
        r.op(t, t + 1, "aten.add_.Tensor", phase="optimizer", stack=SITE)
        r.comm("all_reduce", t + 2, t + 3, t + 5, phase="grad_sync", stack=SITE)
        r.comm("all_gather", t + 6, t + 7, t + 9, phase="forward", stack=SITE, module="Net.a")
        r.next_step(t + 10)
        ranks.append(r)
    return write_run(directory, ranks)


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


def test_trace_diff_compares_runs_with_the_new_phases(tmp_path):
    from viz.diff import diff_runs
    from viz.render.diff_json import to_json
    from viz.run import open_run
    a = phase_run(tmp_path / "a")
    b = phase_run(tmp_path / "b", extra_recompute=1)
    result = to_json(diff_runs(open_run(a), open_run(b)))
    assert result["structural_change"]
    assert [o for o in result["totals"]["ops"] if o["phase"] == "recompute"] == [
        {"module": "Net.a", "op": "aten.mm.default", "phase": "recompute", "a": 2, "b": 4}]


def test_format_1_traces_with_the_old_phases_still_read(tmp_path):
    import tracer
    from tracer.files import format as fmt
    r = SyntheticRank(0, 1)
    r.op(0, 1, phase="backward")
    path = write_run(tmp_path, [r])
    old = fmt.FORMAT_VERSION
    try:
        fmt.FORMAT_VERSION = 1
        r.write(str(tmp_path / "v1"))
    finally:
        fmt.FORMAT_VERSION = old
    import pyarrow as pa
    with pa.OSFile(str(tmp_path / "v1" / "rank-0.arrow")) as fh:
        assert pa.ipc.open_stream(fh).schema.metadata[b"paratrace.version"] == b"1"
    for directory in (path, str(tmp_path / "v1")):
        (record,) = [e for e in tracer.load(f"{directory}/rank-0.arrow").records()
                     if e["op"] == "aten.mm.default"]
        assert record["phase"] == "backward"


def test_recomputation_belongs_to_the_backward_pass_it_runs_in(tmp_path):
    """Passes inferred from P2P order (no annotations): B0's ops replayed by checkpointing
    (recompute) still make the B0 pass."""
    from constructed_timelines import BASE, U, analysed, gpipe_two_stages
    from tracer.files.format import COLUMN_NAMES
    ranks = gpipe_two_stages()
    op, phase, t0 = (COLUMN_NAMES.index(c) for c in ("op", "phase", "t0"))
    for r in ranks:
        r.rows = [row for row in r.rows if r.dicts["op"][row[op]] != "paratrace::annotation"]
    b0 = [i for i, row in enumerate(ranks[0].rows) if row[t0] == BASE + 50 * U]
    assert len(b0) == 1
    row = list(ranks[0].rows[b0[0]])
    row[phase] = PHASES.index("recompute")
    ranks[0].rows[b0[0]] = tuple(row)
    tl = analysed(tmp_path, ranks).timeline
    got = [(p.kind, p.microbatch, (p.start - BASE) // U, (p.end - BASE) // U)
           for p in tl.ranks[0].passes if p.step == 1]
    assert got == [("F", 0, 0, 10), ("F", 1, 10, 20), ("B", 0, 50, 70), ("B", 1, 70, 90)]
