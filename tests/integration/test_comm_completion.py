"""When the recorder says a collective ended, on real 2-rank gloo runs where rank 1 arrives late
at every collective (tests/scripts/comm_completion.py): every c10d API (blocking and
async_op=True, coalesced, batch_isend_irecv), functional collectives and DTensor
redistributions. A recorded end must lie between the late rank's arrival and the first op the
waiting rank ran after its wait returned, and nothing a backend runs inside a wait (gloo's
reduce-scatter copies its chunk out of an all-reduce there) may be recorded as the rank's own
work. Orders only, never durations."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import tracer
from support.gpt_helpers import env, free_port
from support.paths import REPO, SCRIPTS

MARKER = "aten.neg.default"        # the first op each case runs after its wait returned
DDP_STEPS = 20
_C10D = {"all_reduce": "all_reduce", "all_gather": "all_gather",
         "all_gather_into_tensor": "all_gather", "reduce_scatter": "reduce_scatter",
         "reduce_scatter_tensor": "reduce_scatter", "broadcast": "broadcast", "reduce": "reduce",
         "gather": "gather", "scatter": "scatter", "all_to_all_single": "all_to_all",
         "all_to_all": "all_to_all", "barrier": "barrier"}


def expected_kinds(rank: int, unsupported: set) -> dict:
    """case -> the collectives the rank records in it, in launch order (none of the
    ``unsupported`` c10d APIs)."""
    cases = {}
    for api, kind in _C10D.items():
        if api in unsupported:
            continue
        cases["sync:" + api] = cases["async:" + api] = [kind]
    cases["sync:send_recv"] = cases["async:send_recv"] = ["send" if rank == 0 else "recv"]
    cases["async:batch_isend_irecv"] = ["send", "recv"]
    cases["coalesced:all_reduce"] = ["all_reduce"]                  # one coalesced work
    cases["coalesced:reduce_scatter_tensor"] = ["reduce_scatter"]
    for name in ("all_reduce", "all_gather", "reduce_scatter"):
        cases["functional:" + name] = [name]
    cases["functional:consumed"] = ["all_reduce"]
    cases["dtensor:shard_to_replicate"] = ["all_gather"]
    cases["dtensor:partial_to_replicate"] = ["all_reduce"]
    cases["dtensor:partial_to_shard"] = ["reduce_scatter"]
    cases["unwaited:all_reduce"] = ["all_reduce"]
    for step in range(DDP_STEPS):
        cases[f"ddp:{step}"] = ["all_reduce"]             # the one bucket
    # the second forward rebuilds the buckets: rank 0's bucket layout, broadcast (indices, sizes)
    cases["ddp:1"] = ["broadcast", "broadcast", "all_reduce"]
    return cases


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    """The script's run: its traces, and the c10d APIs this torch's gloo lacks."""
    out = tmp_path_factory.mktemp("completion")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
           str(SCRIPTS / "comm_completion.py"), str(out)]
    proc = subprocess.run(cmd, cwd=REPO, env=env(), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


@pytest.fixture(scope="module")
def run(out):
    traces = {r: tracer.load(out / f"rank-{r}.arrow") for r in range(2)}
    return traces, {r: by_case(trace) for r, trace in traces.items()}


@pytest.fixture(scope="module")
def unsupported(out) -> set:
    lacks = {r: json.loads((out / f"unsupported-rank-{r}.json").read_text()) for r in range(2)}
    # only list all_to_all may be missing (torch's gloo before 2.13), and on both ranks
    assert lacks[0] == lacks[1] and set(lacks[0]) <= {"all_to_all"}
    return set(lacks[0])


def by_case(trace) -> dict:
    cases: dict = {}
    for e in sorted(trace.records(), key=lambda e: e["t0"]):
        label = next((a["label"] for a in e["annotation"] if ":" in a["label"]), None)
        if label is not None and not e["op"].startswith("paratrace::"):
            cases.setdefault(label, []).append(e)
    return cases


def aligned(trace, t: int) -> int:
    return int(t + trace.clock_offset(np.array([t], dtype=np.int64))[0])


def test_every_api_is_recorded_once_per_case(run, unsupported):
    _, cases = run
    for rank in range(2):
        expected = expected_kinds(rank, unsupported)
        assert set(cases[rank]) == set(expected)
        for name, kinds in expected.items():
            assert [e["kind"] for e in cases[rank][name] if e["kind"]] == kinds, (rank, name)


def test_a_collective_ends_before_the_first_op_after_its_wait(run):
    """The recorded end is no later than the rank's next op once its wait returned (a late
    future callback would land after it, inside the GIL hold) and no earlier than the call's
    return."""
    _, cases = run
    for rank in range(2):
        for name, events in cases[rank].items():
            if name.startswith("unwaited:"):
                continue
            marker = next(e for e in events if e["op"] == MARKER)
            for e in events:
                if e["kind"]:
                    assert e["t1"] is not None, (rank, name)
                    assert e["t_ret"] <= e["t1"] <= marker["t0"], (rank, name, e["op"])


def test_nothing_is_recorded_while_a_rank_waits_in_a_c10d_collective(run):
    """Between a collective's return and its end the rank was in the collective's wait: no op
    of its own (before the fix: gloo's reduce-scatter ran aten.split and aten.copy_ there, so
    the time blocked before them held no completion and counted as compute)."""
    _, cases = run
    for rank in range(2):
        for name, events in cases[rank].items():
            if name.split(":")[0] not in ("sync", "async", "coalesced"):
                continue
            for c in (e for e in events if e["kind"]):
                inside = [e["op"] for e in events if not e["kind"] and e["thread"] == c["thread"]
                          and c["t_ret"] < e["t0"] < c["t1"]]
                assert inside == [], (rank, name, inside)


def test_the_waiting_rank_ends_after_the_late_rank_arrived(run):
    """On rank 0 (which waits for rank 1 in every case) a collective cannot have ended before
    rank 1 launched its side, on the aligned clock, within the clocks' error; that holds for a
    collective nobody waits for, completed by its future, too. Sends and a scatter's root only
    hand data over and may finish before the peer arrives."""
    traces, cases = run
    error = traces[1].clock_error_ns
    checked = 0
    for name, events in cases[0].items():
        waiting = [e for e in events if e["kind"]]
        late = [e for e in cases[1][name] if e["kind"]]
        for mine, theirs in zip(waiting, late):
            if mine["kind"] == "send" or (mine["kind"] == "scatter"):
                continue
            assert mine["t1"] is not None, name
            assert aligned(traces[0], mine["t1"]) + error >= aligned(traces[1], theirs["t0"]), \
                name
            checked += 1
    assert checked >= 30


def test_ddp_bucket_all_reduce_ends_before_ddp_copies_it_back(run):
    """DDP's finalize waits for the bucket's future in C++ (no Work.wait), then copies the
    reduced bucket into the gradients (grad_sync ops after backward): the all-reduce ended
    before the first of them started. Its callback, waiting for the GIL, lost the race to those
    copies in about 1 backward of 5 before the hot path looked at the future itself."""
    _, cases = run
    for rank in range(2):
        for step in range(DDP_STEPS):
            events = cases[rank][f"ddp:{step}"]
            (bucket,) = [e for e in events if e["kind"] == "all_reduce"]
            copies = [e for e in events if not e["kind"] and e["phase"] == "grad_sync"
                      and e["t0"] > bucket["t_ret"]]
            assert copies and bucket["t1"] <= copies[0]["t0"], (rank, step)
