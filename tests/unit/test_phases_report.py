"""Every phase through the analyses and renderers, on a constructed 2-rank run with known ops:
summary.json's op_counts_by_phase and comm rows, the full report (call graphs with the phase
fills, module view, timeline) and trace-diff, without a crash. Also: traces of format 1 (phases
0-2 only) still read."""
from __future__ import annotations

import json

from tracer.vocab.labels import PHASES
from support.constructed.synthetic import SyntheticRank, write_run
from support.constructed_timelines import phase_run


def test_trace_diff_compares_runs_with_the_new_phases(tmp_path):
    from viz.diff import diff_runs
    from viz.render.diff import DiffInput, diff_json
    from viz.run import open_run
    a = phase_run(tmp_path / "a")
    b = phase_run(tmp_path / "b", extra_recompute=1)
    diff_json.render(DiffInput(diff_runs(open_run(a), open_run(b))), str(tmp_path))
    result = json.loads((tmp_path / "diff.json").read_text())
    assert result["structural_change"]
    assert [o for o in result["totals"]["ops"] if o["phase"] == "recompute"] == [
        {"module": "a", "op": "aten.mm.default", "phase": "recompute", "a": 2, "b": 4}]


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
    from support.constructed_timelines import BASE, U, analysed, gpipe_two_stages
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
