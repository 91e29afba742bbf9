"""Critical paths across ranks on constructed traces whose dependencies are known."""
from __future__ import annotations

import pytest

from support.constructed_timelines import BASE, U, analysed, gpipe_two_stages, synthetic
from viz.analysis.crossrank.critical_path import COMM, COMPUTE, IDLE, TRANSFER
from viz.render.summary_schema import build_summary


def spans(path):
    """(rank, start, end, what) of each segment in units, earliest first."""
    return [(s.rank, (s.start - BASE) // U, (s.end - BASE) // U, s.what)
            for s in reversed(path.segments)]


def test_gpipe_path_runs_through_both_stages_and_their_messages(tmp_path):
    """GPipe p=2, m=2 (constructed_timelines.gpipe_two_stages): the step [0, 100) ends on
    rank 0; it resumed at 50 when rank 1's first gradient arrived, rank 1 resumed at 10 when
    rank 0's first activation arrived. Messages are free, so the path is compute only."""
    analysis = analysed(tmp_path, gpipe_two_stages())
    (path,) = analysis.paths
    assert (path.step, path.end_rank) == (1, 0)
    assert spans(path) == [(0, 0, 10, COMPUTE), (1, 10, 50, COMPUTE), (0, 50, 100, COMPUTE)]
    assert path.ns == 100 * U
    assert path.by_rank() == {0: 60 * U, 1: 40 * U}
    out = build_summary(analysis)["cross_rank"]["critical_path"]
    assert out[0]["rank_share"] == {"0": pytest.approx(0.6), "1": pytest.approx(0.4)}
    assert out[0]["kind_share"] == {"compute": pytest.approx(1.0)}


def test_a_late_collective_member_puts_its_work_on_the_path(tmp_path):
    """Rank 1 computes until 60 before an all-reduce the others launched at 10; the transfer
    ends at 80; everybody computes to 100. The path: rank 1's compute up to its arrival, then
    the transfer seen from the rank that ends the step, then that rank's compute."""
    config = {}
    ranks = [synthetic(r, 3, config) for r in range(3)]
    for r in ranks:
        r.op(-20, -10)
        r.next_step(0)
        arrive = 60 if r.rank == 1 else 10
        r.op(0, arrive, module=f"M{r.rank}")
        r.comm("all_reduce", arrive, arrive + 1, 80, group=(0, 1, 2))
        r.op(80, 90 if r.rank == 0 else 95, module="After")
        r.next_step(100)
        r.op(100, 110)
    analysis = analysed(tmp_path, ranks)
    (path,) = analysis.paths
    assert path.end_rank == 0
    assert spans(path) == [(1, 0, 60, COMPUTE), (0, 60, 80, TRANSFER), (0, 80, 100, COMPUTE)]
    assert path.segments[1].detail == "all_reduce waiting for rank 1"
    assert path.by_what() == {COMPUTE: 80 * U, TRANSFER: 20 * U}
    # module shares from the traces: rank 1's op in M1, rank 0's in After; 90-100 is host time
    # after rank 0's last op (still computing, as far as the trace can tell)
    assert path.modules == {"M1": 60 * U, "After": 10 * U, "(between ops)": 10 * U}


def test_a_rank_that_was_last_itself_waits_in_its_own_comm_and_idles(tmp_path):
    r = synthetic(0, 2)
    peer = synthetic(1, 2)
    for x in (r, peer):
        x.op(-20, -10)
        x.next_step(0)
    r.op(0, 10)
    r.comm("all_reduce", 10, 11, 40, group=(0, 1))     # rank 0 arrives last (peer at 5)
    r.op(60_000, 60_010)               # 40 -> 60,000 (60 ms, over IDLE_GAP_NS): idle
    peer.op(0, 5)
    peer.comm("all_reduce", 5, 6, 40, group=(0, 1))
    peer.op(40, 45)
    for x in (r, peer):
        x.next_step(60_050)
        x.op(60_050, 60_060)
    (path,) = analysed(tmp_path, [r, peer]).paths
    assert spans(path) == [(0, 0, 10, COMPUTE), (0, 10, 40, COMM), (0, 40, 60_000, IDLE),
                           (0, 60_000, 60_050, COMPUTE)]
