"""DTensor under the tracer: each DTensor op is a range holding its local ops (local shapes) and
the collectives DTensor issues inside it, counted against torch's CommDebugMode in the same run.
Two launches, started together: 2 ranks (tests/scripts/phases_dtensor.py: ``a @ b`` with both
Shard(0), full_tensor()) and 4 ranks (tests/scripts/phases_dtensor_2d.py: dp=2 x tp=2, TP MLP
with FSDP2 over dp, forward, backward, optimizer). docs/phases.md#dtensor."""
from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest

import tracer
from support.gpt_helpers import env, free_port
from support.paths import REPO, SCRIPTS
from viz.analysis.callgraphs.flops import flops

KIND = {"all_gather_into_tensor": "all_gather", "_allgather_base_": "all_gather",
        "_reduce_scatter_base_": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
        "all_reduce": "all_reduce", "allreduce_": "all_reduce"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    procs = {}
    for nproc, script in ((2, "phases_dtensor.py"), (4, "phases_dtensor_2d.py")):
        out = tmp_path_factory.mktemp(f"dtensor{nproc}")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
               "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
               str(SCRIPTS / script), str(out)]
        procs[nproc] = (out, subprocess.Popen(cmd, cwd=REPO, env=env(), text=True,
                                              stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    loaded = {}
    for nproc, (out, proc) in procs.items():
        _, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err[-4000:]
        loaded[nproc] = {r: (tracer.load(out / f"rank-{r}.arrow").records(),
                             json.loads((out / f"comm-debug-{r}.json").read_text()))
                         for r in range(nproc)}
    return loaded


def section(records, label):
    return [e for e in records if e["annotation"] and e["annotation"][0]["label"] == label]


def dtensor_range(e):
    """The innermost DTensor op range around a record, or None."""
    return next((a for a in reversed(e["annotation"]) if a.get("source") == "dtensor"), None)


def expected(debug: dict) -> Counter:
    return Counter({KIND[name]: n for name, n in debug.items()})


def test_2d_collectives_per_section_match_comm_debug_mode_with_phases(runs):
    for rank, (records, debug) in runs[4].items():
        tp = (rank // 2 * 2, rank // 2 * 2 + 1)          # mesh [[0, 1], [2, 3]]: rows are tp
        dp = (rank % 2, rank % 2 + 2)
        by_section = {}
        for label in ("fwd", "bwd", "opt"):
            comm = [e for e in section(records, label) if e["kind"]]
            assert Counter(e["kind"] for e in comm) == expected(debug[label]), (rank, label)
            by_section[label] = Counter((e["phase"], e["kind"], e["group"]) for e in comm)
            assert all(e["bytes"] > 0 and e["t1"] is not None and e["t1"] >= e["t0"]
                       for e in comm)
        # FSDP2 gathers each layer over dp; RowwiseParallel's output all-reduce over tp
        assert by_section["fwd"] == {("forward", "all_gather", dp): 2,
                                     ("forward", "all_reduce", tp): 1}
        # gathered again for backward; ColwiseParallel's input-gradient all-reduce over tp;
        # FSDP2's gradient reduce-scatters over dp
        assert by_section["bwd"] == {("backward", "all_gather", dp): 2,
                                     ("backward", "all_reduce", tp): 1,
                                     ("grad_sync", "reduce_scatter", dp): 2}
        assert by_section["opt"] == {}
        assert any(e["phase"] == "optimizer" and dtensor_range(e) for e in section(records, "opt"))


def test_2d_local_ops_carry_local_shapes_inside_their_dtensor_op(runs):
    for rank, (records, _) in runs[4].items():
        forward = [e for e in section(records, "fwd") if e["op"] == "aten.addmm.default"]
        assert [(e["module"], e["shapes"]) for e in forward] == [
            ("FSDPMLP.up", "f32[16] f32[4,16] f32[16,16]"),       # 32 outputs, 16 on this rank
            ("FSDPMLP.down", "f32[16] f32[4,16] f32[16,16]")]     # 32 inputs, 16 on this rank
        up = dtensor_range(forward[0])
        assert up["label"] == "aten.addmm.default"
        assert up["placements"] == [["S(0)"], ["R"], ["S(1)"]]    # bias, x, weight.t()
        assert up["shapes"] == [[32], [4, 16], [16, 32]]          # global
        # FSDP2 has gathered the parameters over dp: they live on the tp sub-mesh
        assert up["mesh"] == [rank // 2 * 2, rank // 2 * 2 + 1] and up["mesh_dims"] == ["tp"]
        # the range itself is recorded (a paratrace::annotation row), not an op
        assert not any(e["op"] == "aten.addmm.default" and e["shapes"].startswith("f32[32]")
                       for e in records)


def test_flops_come_from_local_shapes(runs):
    for records, _ in runs[4].values():
        fwd = sum(flops(e["op"], e["shapes"]) for e in section(records, "fwd"))
        assert fwd == 2 * (2 * 4 * 16 * 16)      # two addmm of half the global work (8192)
    for records, _ in runs[2].values():
        assert sum(flops(e["op"], e["shapes"]) for e in section(records, "mm-forward")) == \
            2 * 4 * 4 * 6                        # rows 4 of 8: half the global 384


def test_a_redistribution_inside_an_op_is_recorded_inside_it(runs):
    for rank, (records, debug) in runs[2].items():
        for label in ("mm-forward", "mm-backward"):
            comm = [e for e in section(records, label) if e["kind"]]
            assert Counter(e["kind"] for e in comm) == expected(debug[label]), (rank, label)
        (gather,) = [e for e in section(records, "mm-forward") if e["kind"]]
        assert dtensor_range(gather)["label"] == "aten.mm.default"
        assert dtensor_range(gather)["placements"] == [["S(0)"], ["S(0)"]]
        assert (gather["phase"], gather["group"], gather["bytes"]) == ("forward", (0, 1), 48)
        assert gather["t1"] is not None and gather["t1"] >= gather["t_ret"]
        (wait,) = [e for e in section(records, "mm-forward")
                   if e["op"] == "_c10d_functional.wait_tensor.default"]
        assert wait["cid"] == gather["cid"] and wait["t1"] == gather["t1"]
        (mm,) = [e for e in section(records, "mm-forward") if e["op"] == "aten.mm.default"]
        assert mm["shapes"] == "f32[4,4] f32[4,6]" and mm["t0"] >= wait["t1"]
        assert expected(debug["mm-forward"]) == {"all_gather": 1}


def test_full_tensor_all_gather_takes_the_phase_of_where_it_runs(runs):
    for rank, (records, debug) in runs[2].items():
        phases = {}
        for label in ("full", "full-no-grad"):
            comm = [e for e in section(records, label)
                    if e["kind"] or e["op"] == "_c10d_functional.wait_tensor.default"]
            assert Counter(e["kind"] for e in comm if e["kind"]) == expected(debug[label])
            phases[label] = {e["phase"] for e in comm}
        # the loss, grad mode on outside modules: forward, though autograd runs the
        # redistribution's Function forward with grad mode off; a no_grad metric: other
        assert phases == {"full": {"forward"}, "full-no-grad": {"other"}}


def test_nothing_sharding_propagation_runs_on_fake_tensors_is_recorded(runs):
    for records, _ in [*runs[2].values(), *runs[4].values()]:
        inside = [e for e in records if dtensor_range(e) and e["op"] != "paratrace::annotation"]
        assert inside
        # FakeTensorMode's own allocations have no tensor inputs and no DTensor op needs one
        assert not [e for e in inside if e["op"] == "aten.empty_strided.default"]
