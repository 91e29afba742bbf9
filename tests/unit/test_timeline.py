"""Timeline metrics on constructed traces with known times: exact values.

Each test builds its ranks with constructed.synthetic (real trace files through the tracer's own
writer, tests/support/constructed_timelines.py) and analyses them with viz.analysis, so the
analysis goes through the real reader.
"""
from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from support.chrome_trace_checks import check_chrome_trace
from support.constructed_timelines import BASE, U, analysed, gpipe_two_stages, synthetic
from tracer.files.format import COLUMN_NAMES
from tracer.vocab.labels import PHASE_BACKWARD, PHASE_FORWARD
from viz.analysis import recount
from viz.analysis.timeline import intervals, metrics
from viz.analysis.timeline.lanes import P2PLink
from viz.analysis.timeline.rank_lanes import IDLE_GAP_NS
from viz.render import timeline_json
from viz.render.report import ReportInput, timeline as timeline_files
from viz.render.summary_schema import time_json


def metrics_of(tmp_path, ranks):
    return analysed(tmp_path, ranks).metrics


def seconds(units):
    return units * U / 1e9


def test_compute_comm_overlap_exposed_exact(tmp_path):
    """One rank, step 1 = [1000, 2000): ops, host gaps, an async all-reduce [1400, 1700)."""
    r = synthetic(0, 1)
    r.op(0, 100)                       # step 0: setup, not counted
    r.next_step(1000)
    r.op(1000, 1200)
    r.op(1250, 1400)                   # gap 1200-1250: host time, counts as compute
    r.comm("all_reduce", 1400, 1410, 1700, group="0")   # launch 1400-1410, done at 1700
    r.op(1420, 1500)                   # overlaps the all-reduce
    r.op(1800, 1900)                   # gap 1500-1800 holds the completion: waiting until 1700
    r.next_step(2000)
    r.op(2000, 2100)
    m = metrics_of(tmp_path, [r])[0]
    # compute [1000,1400) + [1410,1500) + [1700,2000) = 790; comm [1400,1700) = 300
    assert m.counted_steps == (1,)
    assert m.wall_s == pytest.approx(seconds(1000))
    assert m.compute_s == pytest.approx(seconds(790))
    assert m.comm_s == pytest.approx(seconds(300))
    assert m.overlapped_comm_s == pytest.approx(seconds(90))
    assert m.exposed_comm_s == pytest.approx(seconds(210))
    assert m.idle_s == pytest.approx(0.0)
    assert m.overlap_fraction == pytest.approx(0.3)
    assert m.bubble_fraction == pytest.approx(0.21)
    assert m.pipeline is None and m.theoretical_bubble_fraction is None
    assert [s.step for s in m.steps] == [0, 1, 2]
    time = time_json(m)
    for key in ("wall_s", "compute_s", "comm_s", "exposed_comm_s", "idle_s", "overlap_fraction",
                "bubble_fraction"):
        assert time[key] == pytest.approx(getattr(m, key))
    json.dumps(time)


def test_long_gap_is_idle_and_no_comm_gives_no_overlap(tmp_path):
    r = synthetic(0, 1)
    r.next_step(0)
    r.op(0, 1000)
    gap = IDLE_GAP_NS // U + 500
    r.op(1000 + gap, 2000 + gap)
    r.next_step(3000 + gap)
    r.op(3000 + gap, 3001 + gap)
    m = metrics_of(tmp_path, [r])[0]
    assert m.idle_s == pytest.approx(seconds(gap))
    assert m.compute_s == pytest.approx(seconds(3000))   # two ops and the short host gap after
    assert m.comm_s == 0 and m.overlap_fraction is None


def test_pipeline_bubble_matches_gpipe_theory_and_splits_by_section(tmp_path):
    m = metrics_of(tmp_path, gpipe_two_stages())
    for rank in (0, 1):
        p = m[rank].pipeline
        assert p.window_s == pytest.approx(seconds(90))
        assert p.bubble_fraction == pytest.approx(1 / 3)
        assert m[rank].theoretical_bubble_fraction == pytest.approx(1 / 3)
        # replaying the same passes with free communication gives the same schedule
        assert p.simulated_bubble_fraction == pytest.approx(1 / 3)
    # rank 0 waits for its first gradient (warm-up); rank 1 waits for its first input (warm-up)
    # and for rank 0 to finish (cool-down)
    assert (m[0].pipeline.warmup_fraction, m[0].pipeline.steady_fraction,
            m[0].pipeline.cooldown_fraction) == pytest.approx((30 / 90, 0, 0))
    assert (m[1].pipeline.warmup_fraction, m[1].pipeline.steady_fraction,
            m[1].pipeline.cooldown_fraction) == pytest.approx((10 / 90, 0, 20 / 90))
    # step window [0, 100): rank 0 computes 20 + 50 (host time after B1 up to the next step),
    # waits 30 in its recv; sends end when their recvs completed (zero length here)
    assert m[0].compute_s == pytest.approx(seconds(70))
    assert m[0].exposed_comm_s == pytest.approx(seconds(30))
    assert m[0].idle_s == pytest.approx(0)
    assert m[1].compute_s == pytest.approx(seconds(90))
    assert m[1].comm_s == pytest.approx(seconds(10))
    assert m[0].passes == pytest.approx({"F": seconds(10), "B": seconds(20)})


def gpipe_timed(m, f, b, latency=0, pipelining_labels=False):
    """GPipe on two stages, any number of micro-batches; rank r's passes compute f[r] and b[r]
    units; a message arrives ``latency`` units after it is sent. Passes are tracer annotations,
    or torch.distributed.pipelining's record_function labels ("PP:<stage><F|B><mb>")."""
    def annotate(r, kind, start, end, i):
        if pipelining_labels:
            r.annotate(f"PP:{r.rank}{kind}{i}", start, end, source="record_function")
        else:
            r.annotate(kind, start, end, microbatch=i, chunk=0)

    config = {"pp": 2, "microbatches": m, "schedule": "gpipe", "virtual_stages": 1}
    r0, r1 = synthetic(0, 2, config), synthetic(1, 2, config)
    for r in (r0, r1):
        r.op(-50, -40)
        r.next_step(0)
    free, sent = [0, 0], {}
    for i in range(m):                      # rank 0 forwards
        annotate(r0, "F", free[0], free[0] + f[0], i)
        r0.op(free[0], free[0] + f[0])
        free[0] += f[0]
        r0.comm("send", free[0], free[0], 10_000, peer=1)
        sent[("F", i)] = free[0] + latency
    for i in range(m):                      # rank 1 forwards then backwards
        start, ready = free[1], max(free[1], sent[("F", i)])
        r1.comm("recv", start, start, ready, peer=0)
        r1.op(ready, ready + f[1])
        annotate(r1, "F", start, ready + f[1], i)
        free[1] = ready + f[1]
    for i in range(m):
        annotate(r1, "B", free[1], free[1] + b[1], i)
        r1.op(free[1], free[1] + b[1], phase=PHASE_BACKWARD)
        free[1] += b[1]
        r1.comm("send", free[1], free[1], 10_000, peer=0)
        sent[("B", i)] = free[1] + latency
    for i in range(m):                      # rank 0 backwards
        start, ready = free[0], max(free[0], sent[("B", i)])
        r0.comm("recv", start, start, ready, peer=1)
        r0.op(ready, ready + b[0], phase=PHASE_BACKWARD)
        annotate(r0, "B", start, ready + b[0], i)
        free[0] = ready + b[0]
    end = max(free) + 10
    for r in (r0, r1):
        r.next_step(end)
        r.op(end, end + 10)
    return r0, r1, max(free)


@pytest.mark.parametrize("pipelining_labels", [False, True])
def test_imbalanced_stages_measured_equals_replay_and_exceeds_theory(tmp_path,
                                                                      pipelining_labels):
    """Rank 1's passes take twice as long: rank 0 idles 0.6 of the window, rank 1 0.2; the
    replay with free communication agrees (communication is free here), the theory (equal
    stages) says 1/3. The same from torch.distributed.pipelining's labels."""
    r0, r1, window = gpipe_timed(2, f=(10, 20), b=(20, 40), pipelining_labels=pipelining_labels)
    assert window == 150
    m = metrics_of(tmp_path, [r0, r1])
    for rank, expected in ((0, 0.6), (1, 0.2)):
        p = m[rank].pipeline
        assert p.bubble_fraction == pytest.approx(expected)
        assert p.simulated_bubble_fraction == pytest.approx(expected)
        assert m[rank].theoretical_bubble_fraction == pytest.approx(1 / 3)


def test_p2p_latency_shows_as_measured_minus_replay(tmp_path):
    """Balanced stages, m=4: no latency gives the theory exactly; 5 units per message widen
    the measured bubble while the replay stays at the theory."""
    r0, r1, _ = gpipe_timed(4, f=(10, 10), b=(20, 20))
    (tmp_path / "free").mkdir()
    m = metrics_of(tmp_path / "free", [r0, r1])
    assert [m[r].pipeline.bubble_fraction for r in (0, 1)] == pytest.approx([0.2, 0.2])
    r0, r1, window = gpipe_timed(4, f=(10, 10), b=(20, 20), latency=5)
    (tmp_path / "slow").mkdir()
    m = metrics_of(tmp_path / "slow", [r0, r1])
    for r in (0, 1):
        assert m[r].pipeline.simulated_bubble_fraction == pytest.approx(0.2)
        assert m[r].pipeline.bubble_fraction == pytest.approx(1 - 120 / window)
        assert m[r].pipeline.bubble_fraction > 0.2


def test_send_ends_at_matched_recv_and_links_feed_chrome_flows(tmp_path):
    tl = analysed(tmp_path, gpipe_two_stages()).timeline
    assert len(tl.links) == 4
    sends = [c for lane in tl.ranks.values() for c in lane.comm if c.kind == "send"]
    assert all(c.capped for c in sends)
    assert sorted((c.end - BASE) // U for c in sends) == [10, 20, 50, 70]
    trace = json.loads(timeline_json.render(tl))
    check_chrome_trace(trace["traceEvents"], expected_flows=4)
    # each flow keeps its link's number, written with its rank's slices; a link whose other end
    # has no slice (a rank dropped after matching, a row that is no span) draws no arrow
    ids = sorted(e["id"] for e in trace["traceEvents"] if e["ph"] in "sf")
    assert ids == [0, 0, 1, 1, 2, 2, 3, 3]
    send = next(c for c in tl.ranks[0].comm if c.kind == "send")
    tl.links += [P2PLink(0, send.index, 7, 0), P2PLink(0, send.index, 1, 10 ** 9)]
    trace = json.loads(timeline_json.render(tl))
    check_chrome_trace(trace["traceEvents"], expected_flows=4)


def test_op_tables_weigh_a_send_waited_late_as_the_timeline_does(tmp_path):
    """An isend waited 100 units later, whose receive completed after 30: the op groups (the
    front page's top collectives, the rank pages, trace-diff's recount) count 30, not 100; a
    send that completed before its receive keeps its own 5."""
    r0, r1 = synthetic(0, 2), synthetic(1, 2)
    for r in (r0, r1):
        r.next_step(0)
    r0.comm("send", 0, 1, 100, peer=1)
    r1.comm("recv", 0, 1, 30, peer=0)
    r0.comm("send", 110, 111, 115, peer=1)
    r1.comm("recv", 105, 106, 130, peer=0)
    analysis = analysed(tmp_path, [r0, r1])
    for mine in (analysis.ranks[0], recount(analysis, frozenset({1})).ranks[0]):
        (send,) = [g for g in mine.op_groups if g.kind == "send"]
        assert (send.count, send.time_ns) == (2, (30 + 5) * U)
    (send,) = [g for g in analysis.ranks[0].counted_op_groups if g.kind == "send"]
    assert send.time_ns == (30 + 5) * U


def test_write_timeline_svg_and_chrome_trace(tmp_path):
    analysis = analysed(tmp_path / "run", gpipe_two_stages())
    out = tmp_path / "out"
    written = timeline_files.render(ReportInput(analysis), str(out))
    assert written == [str(out / name) for name in ("timeline.svg", "timeline.json",
                                                    "timeline.html")]
    files = ReportInput.TIMELINE_FILES
    svg = ET.parse(out / files["svg"]).getroot()
    ns = "{http://www.w3.org/2000/svg}"
    texts = [t.text for t in svg.iter(ns + "text")]
    assert sum(t == "rank 0" or t == "rank 1" for t in texts) == 2
    # each rank shows F0 F1 B0 B1 labelled with their micro-batch
    assert sorted(t for t in texts if t in ("0", "1")) == ["0"] * 4 + ["1"] * 4
    titles = [t.text for t in svg.iter(ns + "title")]
    assert any("F micro-batch 1 chunk 0" in t for t in titles)
    assert "pipeline bubble 33% (theory 33%, replayed with free comm 33%)" in texts
    assert any(t == "step boundary" for t in texts)
    # every text's class is one the stylesheet styles (class_ once came out as "class-")
    style = next(svg.iter(ns + "style")).text
    classes = {t.get("class") for t in svg.iter(ns + "text")} - {None}
    assert {"axis", "rank", "lane", "metric", "steplabel"} <= classes
    assert all(f".{c}{{" in style for c in classes), classes
    assert not any(k.endswith("-") for t in svg.iter(ns + "text") for k in t.attrib)
    check_chrome_trace(json.loads((out / files["chrome_trace"]).read_text())["traceEvents"], 4)


def test_passes_inferred_from_p2p_order_without_annotations(tmp_path):
    ranks = gpipe_two_stages()
    op = COLUMN_NAMES.index("op")
    for r in ranks:   # drop the annotations: only ops and P2P remain
        r.rows = [row for row in r.rows if r.dicts["op"][row[op]] != "paratrace::annotation"]
    tl = analysed(tmp_path, ranks).timeline
    got = [(p.kind, p.microbatch, (p.start - BASE) // U, (p.end - BASE) // U)
           for p in tl.ranks[0].passes if p.step == 1]
    assert got == [("F", 0, 0, 10), ("F", 1, 10, 20), ("B", 0, 50, 70), ("B", 1, 70, 90)]
    assert all(p.source == "inferred" for p in tl.ranks[0].passes)


def test_record_function_labels_of_torch_pipelining(tmp_path):
    r0 = synthetic(0, 1)
    r0.next_step(0)
    r0.annotate("PP:1F3", 0, 10)
    r0.op(0, 10)
    r0.annotate("PP:1I3", 10, 20)
    r0.op(10, 20, phase=PHASE_BACKWARD)
    r0.annotate("Backward 2", 20, 30)
    r0.op(20, 30, phase=PHASE_BACKWARD)
    r0.annotate("optimizer", 30, 40)
    tl = analysed(tmp_path, [r0]).timeline
    passes = [(p.kind, p.microbatch, p.chunk, p.source) for p in tl.ranks[0].passes]
    assert passes == [("F", 3, 1, "record_function"), ("B", 3, 1, "record_function"),
                      ("B", 2, 0, "record_function")]
    assert [a[2] for a in tl.ranks[0].annotations] == ["optimizer"]


@pytest.mark.parametrize("args, expected", [
    (("gpipe", 4, 8), 3 / 11), (("1f1b", 2, 4), 0.2),
    (("interleaved", 4, 8, 2), 3 / 19),          # bubble/ideal 3/16 -> fraction 3/19
    (("interleaved", 2, 4, 2), 1 / 9),
    (("zb-h1", 4, 8), 1 / 9),                    # (p-1)(T_F+T_B-T_W) = 3 vs ideal 24
    (("1f1b", 1, 4), 0.0), (("unknown", 2, 4), None), (("gpipe", 0, 4), None),
])
def test_theoretical_bubble(args, expected):
    assert metrics.theoretical_bubble(*args) == pytest.approx(expected)


def test_zb_h1_theory_uses_pass_times():
    # T_F = T_B = T_W: a third of 1F1B's bubble time (docs/oracles.md)
    one_f_one_b = 3 * 3 / (3 * 3 + 8 * 3)
    zb = metrics.theoretical_bubble("zb-h1", 4, 8, t_f=1, t_b=1, t_w=1)
    assert zb / (1 - zb) == pytest.approx(one_f_one_b / (1 - one_f_one_b) / 3)


def test_empty_and_unfinished_ranks_do_not_break_metrics(tmp_path):
    empty = synthetic(0, 2)
    hung = synthetic(1, 2)
    hung.next_step(0)
    hung.op(0, 10)
    hung.comm("all_reduce", 10, 11, None, group="0,1")   # never completed
    analysis = analysed(tmp_path, [empty, hung])
    m = analysis.metrics
    assert m[0].wall_s == 0 and m[0].bubble_fraction is None and m[0].steps == []
    spans = analysis.timeline.ranks[1].comm
    # in flight until the end of the recording
    assert [(c.completed, c.end) for c in spans] == [(False, BASE + 11 * U)]
    svg, _, _ = timeline_files.render(ReportInput(analysis), str(tmp_path / "out"))
    assert (tmp_path / "out" / "timeline.svg").stat().st_size > 0 and svg.endswith(".svg")


def test_interval_algebra():
    a = intervals.union(intervals.intervals([0, 5, 20, 22], [10, 12, 25, 30]))
    assert a.tolist() == [[0, 12], [20, 30]]
    b = intervals.union(intervals.intervals([8, 25], [21, 40]))
    assert intervals.intersect(a, b).tolist() == [[8, 12], [20, 21], [25, 30]]
    assert intervals.gaps(a, -5, 35).tolist() == [[-5, 0], [12, 20], [30, 35]]
    assert intervals.clip(a, 5, 25).tolist() == [[5, 12], [20, 25]]
    assert intervals.window(a, 5, 25).tolist() == [[5, 12], [20, 25]]
    assert intervals.length(a) == 22
    prefix = intervals.Prefix(a)
    assert prefix.length(5, 25) == 12 and prefix.length(-100, 100) == 22
    assert prefix.length(12, 20) == 0


@pytest.mark.parametrize("schedule, v, expected", [
    ("1f1b", 1, 0.375), ("interleaved", 2, 0.1875), ("interleaved", 4, 0.094)])
def test_replay_reproduces_the_oracle_dependency_simulation(tmp_path, schedule, v, expected):
    """docs/oracles.md: T_F=1, T_B=2, free communication, p=4, m=8 gives bubble/ideal 0.375 (1F1B),
    0.1875 (interleaved v=2), 0.094 (v=4). Each rank's passes are written back to back in the
    reference GPT's schedule order (no waits: only the order and the durations matter to the
    replay); the replay must rebuild the pipeline's bubble."""
    from tracer.vocab.schedules import schedule_actions
    p, m = 4, 8
    f, b = 8 // v, 16 // v        # units per chunk pass: a chunk holds 1/v of the stage
    ranks = []
    for rank in range(p):
        r = synthetic(rank, p)
        r.next_step(0)
        t = 0
        for action in schedule_actions(schedule, stages=p, rank=rank, microbatches=m, chunks=v):
            d = f if action.kind == "F" else b
            r.annotate(action.kind, t, t + d, microbatch=action.microbatch, chunk=action.chunk)
            r.op(t, t + d, phase=PHASE_FORWARD if action.kind == "F" else PHASE_BACKWARD)
            t += d
        r.comm("send", t, t, t, peer=(rank + 1) % p, group=(0, 1, 2, 3))   # names the group
        r.next_step(t + 10)
        r.op(t + 10, t + 11)
        ranks.append(r)
    m_ = metrics_of(tmp_path, ranks)
    for rank in range(p):
        replayed = m_[rank].pipeline.simulated_bubble_fraction
        assert replayed / (1 - replayed) == pytest.approx(expected, abs=1e-3)
