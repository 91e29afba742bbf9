"""The recorder in real multi-process gloo runs: every collective API, DTensor against torch's
CommDebugMode in the same run, torch.distributed.pipelining's 1F1B send/recv, clock alignment."""
from __future__ import annotations

import collections
import json
import subprocess
import sys

import pytest

import tracer
from support.gpt_helpers import env, free_port, torchrun
from support.paths import REPO, SCRIPTS


def comm_counts(trace, label=None, step=None) -> collections.Counter:
    counts = collections.Counter()
    for e in trace.records():
        if not e["kind"]:
            continue
        if label is not None and not any(a["label"] == label for a in e["annotation"]):
            continue
        if step is not None and e["step"] != step:
            continue
        counts[e["kind"]] += 1
    return counts


@pytest.fixture(scope="module")
def collectives(tmp_path_factory):
    out = tmp_path_factory.mktemp("collectives")
    torchrun("tracer_collectives.py", out)
    return out, {r: tracer.load(out / f"rank-{r}.arrow") for r in range(2)}


def test_every_c10d_collective_kind_is_recorded_once_with_group_bytes_and_completion(collectives):
    _, traces = collectives
    for rank, trace in traces.items():
        assert trace.status == "ok" and trace.rank == rank and trace.world_size == 2
        counts = comm_counts(trace, "c10d")
        assert counts == {"all_reduce": 2, "all_gather": 2, "reduce_scatter": 1, "broadcast": 1,
                          "reduce": 1, "gather": 1, "scatter": 1, "all_to_all": 1, "barrier": 1,
                          "send": 1 + (rank == 0), "recv": 1 + (rank == 1)}
        for e in trace.records():
            if not e["kind"] or not any(a["label"] == "c10d" for a in e["annotation"]):
                continue
            assert e["group"] == (0, 1)
            # completion is measured, not the launch: after the call returned, never missing
            assert e["t1"] is not None and e["t1"] >= e["t_ret"] >= e["t0"], e
            if e["kind"] == "barrier":
                assert e["bytes"] == 0
            elif e["kind"] == "reduce_scatter":
                assert e["bytes"] == 1024                 # its full input
            elif e["kind"] == "scatter":                  # the root hands every chunk, others none
                assert e["bytes"] == (2048 if rank == 0 else 0)
                # a receiver names the dtype of what it receives, as the root does: the members
                # of one collective agree (a receiver used to record none, a "mismatch")
                assert e["dtype"] == "f32"
            else:
                assert e["bytes"] == 1024 and e["dtype"] == "f32", e
            if e["kind"] in ("send", "recv"):
                assert e["peer"] == 1 - rank
            if e["kind"] == "broadcast":
                assert e["peer"] == 1                     # the root, as a global rank
        # numbered per group, collectives and send/recv apart (Flight Recorder's seq_id and
        # p2p_seq_id): 0, 1, 2, ... each
        for p2p in (False, True):
            seqs = [e["seq"] for e in trace.records() if e["kind"] and e["group"] == (0, 1)
                    and (e["kind"] in ("send", "recv")) == p2p]
            assert seqs == list(range(len(seqs))), (p2p, seqs)


def test_functional_collectives_pair_with_their_waits(collectives):
    _, traces = collectives
    for trace in traces.values():
        records = trace.records()
        functional = [e for e in records if e["kind"] and
                      any(a["label"] == "functional" for a in e["annotation"])]
        assert collections.Counter(e["kind"] for e in functional) == {
            "all_reduce": 1, "all_gather": 1, "reduce_scatter": 1}
        assert all(e["async_op"] and e["t1"] is not None for e in functional)
        waits = [e for e in records if e["op"] == "_c10d_functional.wait_tensor.default"
                 and any(a["label"] == "functional" for a in e["annotation"])]
        by_cid = {e["cid"]: e for e in functional}
        assert len(waits) == 2 and all(w["cid"] in by_cid for w in waits)
        for w in waits:      # the collective completes when its wait returns
            assert by_cid[w["cid"]]["t1"] == w["t1"]


def test_dtensor_collectives_match_comm_debug_mode(collectives):
    out, traces = collectives
    for rank, trace in traces.items():
        reference = json.loads((out / f"commdebug-{rank}.json").read_text())
        expected = collections.Counter()
        for name, count in reference.items():
            base = name.split(".")[-1]
            expected[{"all_gather_into_tensor": "all_gather",
                      "reduce_scatter_tensor": "reduce_scatter"}.get(base, base)] += count
        assert sum(expected.values()) > 0
        assert comm_counts(trace, "dtensor") == expected


def test_clock_offsets_are_estimated_at_start_and_end(collectives):
    _, traces = collectives
    assert traces[0].meta["clock_start"]["method"] == "reference"
    start, end = traces[1].meta["clock_start"], traces[1].meta["clock_end"]
    assert start["method"] == end["method"] == "ping-pong"
    # same node, same CLOCK_MONOTONIC: the estimate must contain 0 within its error bound
    assert abs(start["offset_ns"]) <= start["error_ns"] + 1000
    assert 0 < traces[1].clock_error_ns < 50_000_000


def test_pipelining_1f1b_send_recv_counts(tmp_path):
    torchrun("tracer_pipelining.py", tmp_path)
    for rank in range(2):
        trace = tracer.load(tmp_path / f"rank-{rank}.arrow")
        # step 1 (after the first optimizer step) is steady: 4 micro-batches, one activation
        # and one gradient message each way per micro-batch
        assert comm_counts(trace, step=1) == {"send": 4, "recv": 4}
        first = comm_counts(trace, step=0)          # plus the shape handshake on step 0
        assert first["send"] >= 4 and first["recv"] >= 4
        peers = {e["peer"] for e in trace.records() if e["kind"] in ("send", "recv")}
        assert peers == {1 - rank}


@pytest.mark.parametrize("kind", ["all_reduce", "reduce_scatter"])
def test_a_collective_whose_peer_died_is_recorded_failed_not_completed(tmp_path, kind):
    """all_reduce fails in its future's callback; gloo's reduce-scatter has no future and fails
    in the caller's wait()."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
           str(SCRIPTS / "tracer_peer_dies.py"), str(tmp_path), kind]
    proc = subprocess.run(cmd, cwd=REPO, env=env(), capture_output=True, text=True, timeout=240)
    assert proc.returncode != 0
    survivor = tracer.load(tmp_path / "rank-0.arrow")
    assert survivor.status == "failed" and survivor.meta["error"]
    comms = [e for e in survivor.records() if e["kind"]]
    assert [e["kind"] for e in comms] == ["all_reduce", kind]
    assert comms[0]["t1"] is not None and comms[1]["t1"] is None
    failed = survivor.meta["failed_collectives"]
    assert [f["kind"] for f in failed] == [kind] and failed[0]["seq"] == 1
    assert failed[0]["error"] and not survivor.meta["inflight"]
    dead = tracer.load(tmp_path / "rank-1.arrow")      # killed without closing: still readable
    assert dead.status == "running" and [e["kind"] for e in dead.records() if e["kind"]] == \
        ["all_reduce"]
