"""Parallel dimensions on real runs (4 gloo ranks): groups named by a torchtitan-style
DeviceMesh and by ``new_group(group_desc=...)``, and the reference GPT's own named groups;
each rank's calls per dimension against the calls the script made, counted by the script
itself (dimension_groups.py's fixed counts; counted_collectives.py around the GPT), never read
from the trace."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import tracer
from support.cli import trace_run
from support.paths import SCRIPTS
from tracer.files import rundir
from tracer.vocab.groups import group_text

pytestmark = pytest.mark.integration


def _summary(out) -> dict:
    with open(out / "summary.json") as fh:
        return json.load(fh)


def test_mesh_and_group_desc_names_give_each_group_its_dimension(tmp_path):
    out, expected_file = tmp_path / "run", tmp_path / "expected.json"
    proc = trace_run("--nproc-per-node", "4", "--out", out, SCRIPTS / "dimension_groups.py",
                     expected_file, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    expected = json.loads(expected_file.read_text())
    summary = _summary(out)
    groups = {tuple(g["group"]): (g["desc"], g["dimension"], g["from"])
              for g in summary["process_groups"]}
    assert groups == {(0, 1): ("mesh_tp", "tp", "name"), (2, 3): ("mesh_tp", "tp", "name"),
                      (0, 2): ("mesh_dp_shard", "dp", "name"),
                      (1, 3): ("mesh_dp_shard", "dp", "name"),
                      (0, 3): ("cp", "cp", "name"), (1, 2): ("cp", "cp", "name"),
                      (0, 1, 2, 3): (None, "world", "ranks")}
    assert tuple(expected["tp"]) in groups and tuple(expected["dp_shard"]) in groups
    calls = expected["calls"]
    per_dim = {"tp": calls["tp"], "dp": calls["dp_shard"], "cp": calls["cp"],
               "world": calls["unnamed"]}
    for rank in range(4):
        entry = summary["ranks"][str(rank)]
        counted = len(entry["time"]["counted_steps"])
        assert counted == expected["steps"] - 1          # step 0 left out
        dims = entry["dimensions"]
        assert {d: v["count"] for d, v in dims.items()} == {
            d: n * counted for d, n in per_dim.items()}
        assert all(v["bytes"] == 16 * 4 * v["count"] for v in dims.values())    # 16 floats
        # the trace itself names the groups this rank used
        meta = tracer.load(rundir.trace_file(str(out / "traces"), rank)).meta
        assert {desc["desc"] for desc in meta["process_groups"].values()} == {
            "mesh_tp", "mesh_dp_shard", "cp"}
    page = (out / "index.html").read_text()
    assert "Communication by parallel dimension" in page
    assert "tp: [0,1], [2,3] (named tp)" in page and "world: " in page


def test_the_reference_gpt_names_its_groups_and_counts_per_dimension(tmp_path):
    # each rank counts its own collective calls, per step and group name, apart from the
    # recorder (tests/scripts/counted_collectives.py runs the GPT)
    out, counts = tmp_path / "run", tmp_path / "calls"
    proc = trace_run("--nproc-per-node", "4", "--out", out, SCRIPTS / "counted_collectives.py",
                     counts, "sample_runs.train", "--tp", "2", "--no-sp", "--dp", "2", "--pp",
                     "1", "--steps", "3", timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = _summary(out)
    named = {tuple(g["group"]): (g["desc"], g["dimension"]) for g in summary["process_groups"]}
    assert named[(0, 1)] == named[(2, 3)] == ("tp", "tp")
    assert named[(0, 2)] == named[(1, 3)] == ("dp", "dp")
    for rank in range(4):
        entry = summary["ranks"][str(rank)]
        counted = entry["time"]["counted_steps"]
        assert counted == [1, 2]                   # step 0 and the unfinished tail left out
        calls = json.loads(Path(f"{counts}.rank-{rank}.json").read_text())
        want: dict = {}
        for step in counted:
            for desc, n in calls[str(step)].items():
                name = json.loads(desc) or "world"
                want[name] = want.get(name, 0) + n
        got = {d: v["count"] for d, v in entry["dimensions"].items()}
        assert got == want and got["tp"] > 0 and got["dp"] > 0, (rank, calls)
        # the trace itself names the groups this rank used
        meta = tracer.load(rundir.trace_file(str(out / "traces"), rank)).meta
        tp = group_text((rank - rank % 2, rank - rank % 2 + 1))
        assert meta["process_groups"][tp]["desc"] == "tp"


def test_devicemesh_names_stay_where_torch_reuses_groups(tmp_path):
    """init_device_mesh("cpu", (1, 2), mesh_dim_names=("dp_shard", "tp")): tp is torch's default
    group and dp_shard a group of one rank per rank. Before, tp's traffic was labelled world and
    the two groups of one rank read "dp: 0, 1", as one group of both."""
    out, expected_file = tmp_path / "run", tmp_path / "expected.json"
    proc = trace_run("--nproc-per-node", "2", "--out", out, SCRIPTS / "mesh_reused_groups.py",
                     expected_file, timeout=240)
    assert proc.returncode == 0, proc.stderr[-2000:]
    expected = json.loads(expected_file.read_text())
    assert expected["tp"] == [0, 1] and expected["dp_shard"] == [0]
    summary = _summary(out)
    groups = {(tuple(g["group"]), g["process_group"] is None): (g["dimension"], g["from"],
                                                                g["names"])
              for g in summary["process_groups"]}
    assert groups == {((0, 1), True): ("tp", "name", ["tp"]),
                      ((0,), True): ("dp", "name", ["dp_shard"]),
                      ((1,), True): ("dp", "name", ["dp_shard"]),
                      ((0, 1), False): ("dp", "name", ["my_data_parallel"])}
    calls = expected["calls"]
    for rank in range(2):
        entry = summary["ranks"][str(rank)]
        counted = len(entry["time"]["counted_steps"])
        assert counted == expected["steps"] - 1          # step 0 left out
        # a group of one rank moves nothing: dp is the user's group's alone
        assert {d: (v["count"], v["names"]) for d, v in entry["dimensions"].items()} == {
            "tp": (calls["tp"] * counted, ["tp"]),
            "dp": (calls["my_data_parallel"] * counted, ["my_data_parallel"])}
    page = (out / "index.html").read_text()
    assert "<th>dp (my_data_parallel)</th>" in page and "<th>tp</th>" in page
    assert "[0], [1]: groups of one rank, no traffic (named dp_shard)" in page
    assert "world:" not in page
