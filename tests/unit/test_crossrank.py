"""Collectives matched across ranks on constructed traces with known arrivals: exact waits,
skews, stragglers, transfer times, bandwidths, and Flight Recorder's mismatch classes."""
from __future__ import annotations

import pytest

from support.constructed.synthetic import SyntheticRank, write_run
from viz.analysis import analyse
from viz.analysis.crossrank.matching import bus_factor, collective_size, matched_size
from viz.run import open_run
from viz.render.summary_schema import build_summary, collectives_json, mismatch_json
from viz.views.problems import mismatch_text

U = 1_000                  # units of the constructed clocks: 1 us
MB = 1 << 20


def ranks(world: int, group=None):
    return [SyntheticRank(r, world, unit_ns=U) for r in range(world)]


def analysed(tmp_path, rs):
    write_run(tmp_path, rs)
    return analyse(open_run(str(tmp_path)))


def site(rank: int):
    return [(f"/src/train_{rank}.py", 40 + rank, "step", "step")]


def test_a_late_rank_is_the_straggler_and_the_others_wait_for_it(tmp_path):
    """A constructed straggler: 3 ranks, rank 1 arrives 60 units late at each of 6 all-reduces."""
    rs = ranks(3)
    for i in range(6):
        t = 1000 * i
        for r in rs:
            arrive = t + (60 if r.rank == 1 else 0)
            r.op(t - 50, arrive)                       # computing until it arrives
            r.comm("all_reduce", arrive, arrive + 1, t + 70, group=(0, 1, 2), nbytes=MB,
                   stack=site(r.rank))
    cross = analysed(tmp_path, rs).cross
    assert len(cross.matched) == 6 and cross.unmatched == 0 and not cross.mismatches
    assert cross.stragglers() == [(1, pytest.approx(6 * 60 * U / 1e9))]
    assert cross.wait_ns == {0: 6 * 60 * U, 1: 0, 2: 6 * 60 * U}
    for m in cross.matched:
        assert (m.last_rank, m.skew_ns, m.transfer_ns) == (1, 60 * U, 10 * U)
        assert m.algbw == pytest.approx(MB / (10 * U / 1e9))
        assert m.site.file == "/src/train_1.py" and m.site.line == 41     # the late rank's line
    (row,) = collectives_json(cross)
    assert (row["kind"], row["group"], row["count"], row["bytes"]) == ("all_reduce", [0, 1, 2],
                                                                       6, 6 * MB)
    assert row["median_s"] == pytest.approx(10 * U / 1e9)
    assert row["algbw_GBps"] == pytest.approx(MB / (10 * U / 1e9) / 1e9)
    assert row["busbw_GBps"] == pytest.approx(row["algbw_GBps"] * 4 / 3)
    assert row["site"] == "/src/train_1.py:41"


def test_late_is_measured_against_the_next_latest_rank(tmp_path):
    rs = ranks(3)
    for r, arrive in zip(rs, (0, 60, 20)):
        r.comm("all_reduce", arrive, arrive, 100, group=(0, 1, 2), nbytes=4096)
    cross = analysed(tmp_path, rs).cross
    (m,) = cross.matched
    assert (m.first_arrival, m.last_arrival) == (rs[0].t(0), rs[0].t(60))
    assert {r: m.wait_ns(r) for r in range(3)} == {0: 60 * U, 1: 0, 2: 40 * U}
    assert m.late_ns == 40 * U and cross.stragglers() == [(1, pytest.approx(40 * U / 1e9))]
    assert m.transfer_ns == 40 * U


def test_bandwidth_sizes_and_factors_follow_nccl_tests():
    assert collective_size("all_gather", 1000, 4) == 4000          # the gathered output
    assert collective_size("reduce_scatter", 4000, 4) == 4000      # the full input
    every = {r: 1000 for r in range(4)}
    assert matched_size("all_gather", every, 4) == 4000
    assert matched_size("reduce_scatter", every, 4) == 1000
    assert matched_size("gather", every, 4) == 4000                # what the root receives
    assert matched_size("scatter", {0: 0, 1: 4000, 2: 0, 3: 0}, 4, root=1) == 4000
    assert matched_size("all_to_all", {0: 1000, 1: 3000}, 2) == 2000
    assert bus_factor("all_reduce", 4) == pytest.approx(1.5)
    assert bus_factor("all_gather", 4) == pytest.approx(0.75)
    assert bus_factor("reduce_scatter", 4) == pytest.approx(0.75)
    assert bus_factor("all_to_all", 4) == pytest.approx(0.75)
    assert bus_factor("broadcast", 4) == bus_factor("reduce", 4) == 1.0


def test_all_gather_bandwidth_uses_the_gathered_size(tmp_path):
    rs = ranks(2)
    for r in rs:
        r.comm("all_gather", 0, 1, 100, group=(0, 1), nbytes=MB)
    (row,) = collectives_json(analysed(tmp_path, rs).cross)
    assert row["bytes"] == 2 * MB
    assert row["algbw_GBps"] == pytest.approx(2 * MB / (100 * U / 1e9) / 1e9)
    assert row["busbw_GBps"] == pytest.approx(row["algbw_GBps"] / 2)


@pytest.mark.parametrize("what, differ", [
    ("kind", dict(kind="all_gather")), ("size", dict(nbytes=2048)), ("dtype", dict(dtype="bf16"))])
def test_members_that_disagree_are_named_with_their_source_lines(tmp_path, what, differ):
    rs = ranks(3)
    for r in rs:
        r.comm("all_reduce", 0, 1, 10, group=(0, 1, 2), nbytes=1024, stack=site(r.rank))
        args = dict(kind="all_reduce", nbytes=1024, dtype="f32")
        if r.rank == 2:
            args.update(differ)
        r.comm(args["kind"], 20, 21, 30, group=(0, 1, 2), nbytes=args["nbytes"],
               dtype=args["dtype"], stack=site(r.rank))
    cross = analysed(tmp_path, rs).cross
    assert len(cross.matched) == 1 and cross.unmatched == 3
    (m,) = cross.mismatches
    assert (m.group, m.seq, m.what) == ("0,1,2", 1, what)
    sides = {ranks_: value for value, ranks_, _ in m.sides}
    assert sides[(0, 1)] != sides[(2,)]
    text = mismatch_text(m)
    assert text.startswith(f"collective #1 of group [0,1,2]: ranks disagree on its {what}")
    assert "ranks 0,1:" in text and "rank 2:" in text and "/src/train_2.py:42" in text


def test_a_scatter_matches_though_only_its_root_hands_bytes(tmp_path):
    """A scatter's root hands the whole input, its receivers hand nothing (bytes count what a
    rank hands): that is no size disagreement (parallelize_module's weight scatters)."""
    rs = ranks(3)
    for r in rs:
        r.comm("scatter", 0, 1, 10, group=(0, 1, 2), nbytes=3 * 1024 if r.rank == 0 else 0,
               dtype="f32", stack=site(r.rank))
    cross = analysed(tmp_path, rs).cross
    assert cross.mismatches == [] and len(cross.matched) == 1 and cross.unmatched == 0


def test_twin_process_groups_and_p2p_are_numbered_apart(tmp_path):
    """The recorder's numbering (Flight Recorder's): a send does not move the collectives' count
    and a later group over the same ranks (``0,1@2``) counts on its own, so ranks that order
    them differently still match; a real disagreement on the twin group names it."""
    rs = ranks(2)
    a, b = rs
    a.comm("send", 0, 1, 5, peer=1, group=(0, 1))
    b.comm("recv", 10, 11, 12, peer=0, group=(0, 1))
    for r in rs:
        r.comm("all_reduce", 20, 21, 30, group=(0, 1), nbytes=64)
    a.comm("all_reduce", 40, 41, 50, group="0,1@2", nbytes=16, stack=site(0))
    b.comm("all_reduce", 40, 41, 50, group="0,1@2", nbytes=32, stack=site(1))
    cross = analysed(tmp_path, rs).cross
    assert [(m.group, m.seq) for m in cross.matched] == [("0,1", 0)]
    assert cross.unmatched_p2p == 0
    (m,) = cross.mismatches
    assert (m.group, m.seq, m.what) == ("0,1@2", 0, "size")
    assert mismatch_text(m).startswith("collective #0 of group [0,1 (process group 2)]: ranks "
                                   "disagree on its size")
    assert (mismatch_json(m)["group"], mismatch_json(m)["process_group"]) == ([0, 1], "2")
    assert [(row["group"], row["process_group"])
            for row in collectives_json(cross)] == [([0, 1], None)]


def test_a_rank_that_never_issued_a_collective_is_missing(tmp_path):
    """The usual hang: ranks 0 and 1 wait in collective #2, rank 2 never got there."""
    rs = ranks(3)
    for r in rs:
        r.comm("all_reduce", 0, 1, 10, group=(0, 1, 2))
        if r.rank != 2:
            r.comm("all_reduce", 20, 21, None, group=(0, 1, 2), stack=site(r.rank))
    cross = analysed(tmp_path, rs).cross
    (m,) = cross.mismatches
    assert (m.seq, m.what) == (1, "missing")
    assert m.sides[1][:2] == (None, (2,))
    assert mismatch_text(m) == ("collective #1 of group [0,1,2] (all_reduce, issued by ranks 0,1 "
                            "at /src/train_0.py:40, /src/train_1.py:41): rank 2 never issued it")


def test_a_killed_rank_whose_trace_ends_early_is_not_called_missing(tmp_path):
    """Rank 2 died within a flush of the recorder: its trace (never closed) ends before the
    others launched collective #1, so nobody can tell whether it issued it."""
    rs = ranks(3)
    for r in rs:
        r.comm("all_reduce", 0, 1, 10, group=(0, 1, 2))
    for r in rs[:2]:
        r.comm("all_reduce", 20, 21, None, group=(0, 1, 2), stack=site(r.rank))
    for r in rs[:2]:
        r.write(tmp_path)
    rs[2].write(tmp_path, status=None)
    (m,) = analyse(open_run(str(tmp_path))).cross.mismatches
    assert (m.seq, m.what) == (1, "unknown")
    assert "rank 2: the trace ends before it" in mismatch_text(m)


@pytest.mark.parametrize("later_collective", [False, True])
def test_a_failed_rank_is_unknown_after_its_last_collective_however_late_it_failed(
        tmp_path, later_collective):
    """Rank 2 raised after the others launched collective #1 (its trace runs past their
    launch): it is the failure's consequence, not a mismatch, whatever the timing (that race
    made a real run's verdict change between runs). A failed rank that skipped #1 but issued
    #2 did disagree: missing."""
    rs = ranks(3)
    for r in rs:
        r.comm("all_reduce", 0, 1, 10, group=(0, 1, 2))
    for r in rs[:2]:
        r.comm("all_reduce", 20, 21, None, group=(0, 1, 2), stack=site(r.rank))
        if later_collective:
            r.comm("all_reduce", 40, 41, None, group=(0, 1, 2), stack=site(r.rank))
    rs[2].op(30, 35)                           # still working when the others launched #1
    if later_collective:
        rs[2].comm("all_reduce", 40, 41, None, group=(0, 1, 2), stack=site(2), seq=2)
    for r in rs[:2]:
        r.write(tmp_path)
    rs[2].write(tmp_path, status="failed")
    (m,) = analyse(open_run(str(tmp_path))).cross.mismatches
    assert (m.seq, m.what) == (1, "missing" if later_collective else "unknown")


def test_unreadable_members_are_not_compared_and_p2p_without_peer_is_counted(tmp_path):
    rs = ranks(3)
    for r in rs[:2]:
        r.comm("all_reduce", 0, 1, 10, group=(0, 1, 2))       # rank 2's trace is garbage
    rs[0].comm("send", 20, 20, 30, peer=1, group=(0, 1))       # never received
    rs[0].comm("all_reduce", 40, 41, 50, group=(0,))           # a group of one: nothing to match
    write_run(tmp_path, rs[:2])
    (tmp_path / "rank-2.arrow").write_bytes(b"garbage")
    analysis = analyse(open_run(str(tmp_path)))
    cross = analysis.cross
    assert cross.matched == [] and cross.mismatches == [] and cross.unmatched == 2
    assert cross.unmatched_p2p == 1
    summary = build_summary(analysis)["cross_rank"]
    assert summary["matched"] == 0 and summary["unmatched_p2p"] == 1
    assert summary["wait_s"] == {"0": 0.0, "1": 0.0}


def test_summary_cross_rank_object(tmp_path):
    rs = ranks(2)
    for r in rs:
        r.comm("reduce_scatter", 10 * r.rank, 10 * r.rank + 1, 50, group=(0, 1), nbytes=MB)
    out = build_summary(analysed(tmp_path, rs))["cross_rank"]
    assert out["matched"] == 1 and out["unmatched"] == 0 and out["mismatches"] == []
    assert out["stragglers"] == [{"rank": 1, "late_s": pytest.approx(10 * U / 1e9)}]
    assert out["wait_s"] == {"0": pytest.approx(10 * U / 1e9), "1": 0.0}
    (row,) = out["collectives"]
    assert set(row) == {"kind", "group", "process_group", "dimension", "count", "bytes",
                        "median_s", "algbw_GBps", "busbw_GBps", "site"}
    assert row["dimension"] == "world"           # no name, no grid: the group of every rank
    assert row["process_group"] is None          # the only process group over its ranks
    assert row["busbw_GBps"] == pytest.approx(row["algbw_GBps"] / 2)




def test_the_page_says_bandwidths_in_human_units(tmp_path):
    """A slow collective (1,000 bytes, transferred in 31.6 ms: 31.6 kB/s algbw) and a fast one
    (1 MiB in 10 us: 105 GB/s): each rate in the unit that reads, never 3.16e-05 GB/s."""
    from viz.views.crossrank_page import bandwidth
    from viz.views.formatters import fmt_rate
    rs = ranks(2)
    for r in rs:
        r.comm("all_reduce", 0, 1, 31_646, group=(0, 1), nbytes=1000)
        r.comm("broadcast", 40_000, 40_001, 40_010, group=(0, 1), nbytes=MB)
    rows = {row["kind"]: row for row in bandwidth(analysed(tmp_path, rs), {}, lambda f, l: None)}
    # algbw = S / transfer; all_reduce busbw = 2(n-1)/n x algbw = algbw at n = 2
    assert (rows["all_reduce"]["algbw"], rows["all_reduce"]["busbw"]) == ("31.6 kB/s",) * 2
    assert rows["broadcast"]["algbw"] == f"{MB / 10e-6 / 1e9:.3g} GB/s" == "105 GB/s"
    assert [fmt_rate(v) for v in (0, 999, 999.6, 12_345_678, 2.5e13, None)] == [
        "0 B/s", "999 B/s", "1 kB/s", "12.3 MB/s", "25 TB/s", ""]


CHUNK = 4096


@pytest.mark.parametrize("kind, handed, size, factor", [
    ("scatter", lambda r: 3 * CHUNK if r == 1 else 0, 3 * CHUNK, 2 / 3),   # the root's chunks
    ("gather", lambda r: CHUNK, 3 * CHUNK, 2 / 3),                          # what the root gets
    ("broadcast", lambda r: CHUNK, CHUNK, 1.0),
    ("reduce", lambda r: CHUNK, CHUNK, 1.0)])
@pytest.mark.parametrize("root_arrives", ["last", "first"])
def test_a_rooted_collectives_size_is_the_same_whoever_arrives_last(tmp_path, kind, handed, size,
                                                                    factor, root_arrives):
    """Rank 1 is the root of every call; it arrives 30 units after the others, or 30 before:
    the bytes and bandwidths are the root's payload's either way (nccl-tests' sizes)."""
    rs = ranks(3)
    for i in range(4):
        t = 1000 * i
        for r in rs:
            late = (r.rank == 1) == (root_arrives == "last")
            arrive = t + (30 if late else 0)
            r.comm(kind, arrive, arrive + 1, t + 130, group=(0, 1, 2), peer=1,
                   nbytes=handed(r.rank))
    cross = analysed(tmp_path, rs).cross
    assert cross.mismatches == [] and len(cross.matched) == 4
    assert {m.last_rank for m in cross.matched} == ({1} if root_arrives == "last" else {2})
    (row,) = collectives_json(cross)
    assert (row["kind"], row["count"], row["bytes"]) == (kind, 4, 4 * size)
    assert row["algbw_GBps"] == pytest.approx(size / (100 * U / 1e9) / 1e9)
    assert row["busbw_GBps"] == pytest.approx(row["algbw_GBps"] * factor)


@pytest.mark.parametrize("late", [0, 1])
def test_an_uneven_all_to_all_is_sized_by_its_members_mean(tmp_path, late):
    rs = ranks(2)
    for r in rs:
        arrive = 30 if r.rank == late else 0
        r.comm("all_to_all", arrive, arrive + 1, 130, group=(0, 1),
               nbytes=CHUNK if r.rank == 0 else 3 * CHUNK)
    (row,) = collectives_json(analysed(tmp_path, rs).cross)
    assert row["bytes"] == 2 * CHUNK
