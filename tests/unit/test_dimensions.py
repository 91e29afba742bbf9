"""Parallel dimensions: each process group's, read from its name, the rank grid or its ranks,
and each rank's communication per dimension on a constructed run with known times."""
from __future__ import annotations

import pytest

from support.constructed.synthetic import SyntheticRank, write_run
from tracer.vocab.groups import dimension_of_desc
from viz.analysis import analyse
from viz.analysis.crossrank.dimensions import grid_axis, name_groups, user_names
from viz.analysis.timeline.grid import Grid
from viz.diff import compare_runs
from viz.render.summary_schema import build_summary
from viz.run import open_run
from viz.views.dimension_rows import dimension_table

U = 1_000                  # the constructed clock's unit: 1 us
MB = 1 << 20


@pytest.mark.parametrize("desc, dimension", [
    ("tp", "tp"), ("mesh_tp", "tp"), ("TP", "tp"), ("tensor_parallel", "tp"),
    ("dp_shard_cp", "dp"), ("mesh_dp_replicate", "dp"), ("fsdp", "dp"), ("dp_expert", "dp"),
    ("pp_grad", "pp"), ("pipeline", "pp"), ("mesh_cp", "cp"), ("context", "cp"),
    ("ep", "ep"), ("expert_dp", "ep"), ("sp", "sp"), ("sequence", "sp"),
    ("default_pg", None), ("mesh_default", None), ("undefined", None), ("etp", None),
    ("", None), (None, None), (7, None),
])
def test_a_group_name_says_its_dimension_by_its_first_word_that_names_one(desc, dimension):
    assert dimension_of_desc(desc) == dimension


def test_the_grid_names_a_group_whose_ranks_differ_along_one_axis():
    grid = Grid(tp=2, cp=1, dp=2, pp=2)        # global = tp + 2*(dp + 2*pp)
    assert grid_axis(grid, (0, 1)) == "tp" and grid_axis(grid, (0, 2)) == "dp"
    assert grid_axis(grid, (1, 5)) == "pp" and grid_axis(grid, (0, 3)) is None
    assert grid_axis(grid, (0,)) is None and grid_axis(grid, (0, 8)) is None
    names = name_groups(["0,1", "0,2", "0,1@5", "0,1,2,3,4,5,6,7", "0,3", "?x"],
                        {"0,1@5": {"desc": "mesh_ep"}}, grid, 8)
    assert {t: (g.dimension, g.source) for t, g in names.items()} == {
        "0,1": ("tp", "grid"), "0,2": ("dp", "grid"), "0,1@5": ("ep", "name"),
        "0,1,2,3,4,5,6,7": ("world", "ranks"), "0,3": ("other", "ranks"),
        "?x": ("other", "ranks")}
    assert name_groups(["0,1"], {}, None, 2)["0,1"].dimension == "world"


def _rank(rank: int, dp_sync: bool = True) -> SyntheticRank:
    """Rank ``rank`` of tp=2 x dp=2: step 1 (counted) has compute 0-100 and 260-300 units, a
    TP all-reduce 50-150 (half under compute), a DP one 200-260 and a world one 300-310 (both
    exposed); step 2 is left open (not counted)."""
    tp = (rank - rank % 2, rank - rank % 2 + 1)
    dp = (rank % 2, rank % 2 + 2)
    r = SyntheticRank(rank, 4, {"tp": 2, "pp": 1, "dp": 2}, unit_ns=U,
                      meta={"process_groups": {",".join(map(str, tp)): {"desc": "tp"}}})
    r.next_step(0)
    r.op(0, 100)
    r.comm("all_reduce", 50, 51, 150, group=tp, nbytes=MB)
    if dp_sync:
        r.comm("all_reduce", 200, 201, 260, group=dp, nbytes=2 * MB, phase="grad_sync")
    r.op(260, 300)
    r.comm("all_reduce", 300, 301, 310, group=(0, 1, 2, 3), nbytes=8)
    r.next_step(400)
    r.comm("all_reduce", 410, 411, 420, group=tp, nbytes=MB)     # step 2: not counted
    return r


def test_each_rank_costs_per_dimension_over_its_counted_steps(tmp_path):
    write_run(tmp_path, [_rank(r) for r in range(4)])
    summary = build_summary(analyse(open_run(str(tmp_path))))
    s = U / 1e9
    for rank in range(4):
        dims = summary["ranks"][str(rank)]["dimensions"]
        assert list(dims) == ["dp", "tp", "world"]               # most exposed first
        assert dims["tp"] == {"count": 1, "bytes": MB, "comm_s": pytest.approx(100 * s),
                              "overlapped_s": pytest.approx(50 * s),
                              "exposed_s": pytest.approx(50 * s), "names": ["tp"]}
        assert dims["dp"] == {"count": 1, "bytes": 2 * MB, "comm_s": pytest.approx(60 * s),
                              "overlapped_s": 0.0, "exposed_s": pytest.approx(60 * s),
                              "names": []}
        assert dims["world"]["exposed_s"] == pytest.approx(10 * s)
        # the dimensions' exposed times add up to the rank's (none overlap another here)
        time = summary["ranks"][str(rank)]["time"]
        assert sum(d["exposed_s"] for d in dims.values()) == pytest.approx(time["exposed_comm_s"])
        comm = summary["ranks"][str(rank)]["comm"]
        assert sorted((c["dimension"], c["count"]) for c in comm) == [
            ("dp", 1), ("tp", 2), ("world", 1)]                  # counts: every step
    groups = {tuple(g["group"]): (g["dimension"], g["from"], g["desc"])
              for g in summary["process_groups"]}
    assert groups == {(0, 1): ("tp", "name", "tp"), (2, 3): ("tp", "name", "tp"),
                      (0, 2): ("dp", "grid", None), (1, 3): ("dp", "grid", None),
                      (0, 1, 2, 3): ("world", "ranks", None)}
    assert {c["dimension"] for c in summary["cross_rank"]["collectives"]} == {"tp", "dp",
                                                                             "world"}


def test_trace_diff_compares_calls_bytes_and_exposed_time_per_dimension(tmp_path):
    a = analyse(open_run(write_run(tmp_path / "a", [_rank(r, dp_sync=False) for r in range(4)])))
    b = analyse(open_run(write_run(tmp_path / "b", [_rank(r) for r in range(4)])))
    deltas = {(d.category, d.name): (d.a, d.b) for d in compare_runs(a, b).totals.deltas}
    assert deltas[("dimension", "dp")] == (0, 4)               # one a counted step, 4 ranks
    assert deltas[("dimension bytes", "dp")] == (0, 4 * 2 * MB)
    assert deltas[("dimension", "tp")] == (4, 4)
    exposed = deltas[("time", "exposed comm, dp")]
    assert exposed[0] == 0.0 and exposed[1] == pytest.approx(60 * U / 1e9)   # mean of ranks


def _mesh_rank(rank: int, mine: bool = True) -> SyntheticRank:
    """Rank ``rank`` of init_device_mesh("cpu", (1, 2), mesh_dim_names=("dp_shard", "tp")) as
    the recorder names its groups: tp is torch's default group (desc default_pg), dp_shard a
    group of this rank alone; beside them new_group(group_desc="my_data_parallel") over both.
    A counted step: an all-reduce on each (``mine``: on the user's group too)."""
    r = SyntheticRank(rank, 2, unit_ns=U, meta={"process_groups": {
        "0,1": {"desc": "default_pg", "mesh_dims": ["tp"]},
        str(rank): {"desc": "mesh_dp_shard", "mesh_dims": ["dp_shard"]},
        "0,1@3": {"desc": "my_data_parallel"}}})
    r.next_step(0)
    r.comm("all_reduce", 10, 11, 20, group=(0, 1), nbytes=MB)
    r.comm("all_reduce", 30, 31, 32, group=(rank,), nbytes=4 * MB)
    if mine:
        r.comm("all_reduce", 40, 41, 50, group="0,1@3", nbytes=2 * MB)
    r.next_step(100)
    return r


def test_devicemesh_names_groups_torch_reuses_and_groups_of_one_rank_carry_nothing(tmp_path):
    analysis = analyse(open_run(write_run(tmp_path, [_mesh_rank(r) for r in range(2)])))
    summary = build_summary(analysis)
    groups = {(tuple(g["group"]), g["process_group"]): (g["dimension"], g["from"], g["names"])
              for g in summary["process_groups"]}
    assert groups == {((0, 1), None): ("tp", "name", ["tp"]),      # not "world": the mesh says
                      ((0,), None): ("dp", "name", ["dp_shard"]),
                      ((1,), None): ("dp", "name", ["dp_shard"]),
                      ((0, 1), "3"): ("dp", "name", ["my_data_parallel"])}
    for rank in range(2):
        dims = summary["ranks"][str(rank)]["dimensions"]
        assert {d: (v["count"], v["bytes"], v["names"]) for d, v in dims.items()} == {
            "tp": (1, MB, ["tp"]), "dp": (1, 2 * MB, ["my_data_parallel"])}   # not dp_shard's
    table = dimension_table(analysis)
    assert table["dims"] == ["tp", "dp"] and table["heads"] == ["tp", "dp (my_data_parallel)"]
    assert table["named"] == [
        "tp: [0,1] (named tp)",
        "dp: [0,1 (process group 3)] (named my_data_parallel); "
        "[0], [1]: groups of one rank, no traffic (named dp_shard)"]


def test_a_dimension_of_groups_of_one_rank_alone_is_still_listed(tmp_path):
    analysis = analyse(open_run(write_run(tmp_path, [_mesh_rank(r, mine=False)
                                                      for r in range(2)])))
    table = dimension_table(analysis)
    assert table["dims"] == ["tp"]                    # dp moved nothing
    assert "dp: [0], [1]: groups of one rank, no traffic (named dp_shard)" in table["named"]


def test_trace_diff_names_the_users_groups_beside_their_dimension(tmp_path):
    a = analyse(open_run(write_run(tmp_path / "a", [_mesh_rank(r, mine=False)
                                                    for r in range(2)])))
    b = analyse(open_run(write_run(tmp_path / "b", [_mesh_rank(r) for r in range(2)])))
    deltas = {(d.category, d.name): (d.a, d.b) for d in compare_runs(a, b).totals.deltas}
    assert deltas[("dimension", "dp (my_data_parallel)")] == (0, 2)
    assert deltas[("dimension", "tp")] == (2, 2)
    assert ("time", "exposed comm, dp (my_data_parallel)") in deltas


def test_the_users_names_are_theirs_not_torchs():
    assert user_names("default_pg", ["tp"]) == ("tp",)
    assert user_names("mesh_dp_shard", ["dp_shard"]) == ("dp_shard",)
    assert user_names("mesh_dp_shard") == ("dp_shard",)
    assert user_names("my_data_parallel") == ("my_data_parallel",)
    assert user_names("mesh_default") == user_names("mesh_dim_0") == user_names(None) == ()
