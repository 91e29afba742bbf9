"""Oracles of docs/oracles.md counted by the tracer on real traced runs of the reference GPT:
TP and SP collectives per micro-batch and per layer, pipeline order per rank, P2P per stage,
data-parallel buckets launched from gradient hooks once per iteration, the tied-embedding
all-reduce. Each run is one traced iteration of a tiny model (gloo, CPU)."""
from __future__ import annotations

import re
from collections import Counter

import pytest

from support.gpt_helpers import runs_in_background
from sample_runs.model import GPTChunk, GPTConfig
from tracer.vocab.schedules import schedule_actions
from sample_runs.parallel.process_groups import single_process_groups
from sample_runs.parallel.tensor_parallel import TensorParallel

S, B, H, V = 16, 2, 32, 256  # seq len, micro-batch size, hidden, vocab
FLOAT = 4


def comms(records, kind, *, label=None, microbatch=None, group=None):
    """Communication records of ``kind``; ``label`` is the innermost annotation's label."""
    out = []
    for r in records:
        if r["kind"] != kind or (group is not None and r["group"] != group):
            continue
        inner = r["annotation"][-1] if r["annotation"] else {}
        if label is not None and inner.get("label") != label:
            continue
        if microbatch is not None and inner.get("microbatch") != microbatch:
            continue
        out.append(r)
    return out


def executed_order(records) -> list[str]:
    """F/B/W passes in the order the rank ran them, as tracer.vocab.schedules' Action strings."""
    passes = sorted((r for r in records if r["op"] == "paratrace::annotation"
                     and r["annotation"][-1]["label"] in ("F", "B", "W")), key=lambda r: r["t0"])
    out = []
    for r in passes:
        a = r["annotation"][-1]
        out.append(f"{a['label']}{a['microbatch']}" + (f".{a['chunk']}" if a["chunk"] else ""))
    return out


RUNS = {
    "tp": (2, ["--tp", "2", "--no-sp", "--pp", "1", "--layers", "2", "--microbatches", "2"]),
    "sp": (2, ["--tp", "2", "--sp", "--pp", "1", "--layers", "2", "--microbatches", "2"]),
    "1f1b": (4, ["--tp", "1", "--no-sp", "--pp", "4", "--microbatches", "8", "--layers", "4"]),
    "interleaved": (4, ["--tp", "1", "--no-sp", "--pp", "4", "--microbatches", "8",
                        "--layers", "8", "--schedule", "interleaved", "--virtual-stages", "2"]),
    "zb-dp": (4, ["--tp", "1", "--no-sp", "--pp", "2", "--dp", "2", "--layers", "4",
                  "--schedule", "zb-h1", "--microbatches", "2", "--bucket-size", "8192"]),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Every traced iteration (no dump: nothing but the training in the traces), one launch
    per world size; each test waits for its own."""
    sizes = ["--hidden", str(H), "--heads", "4", "--seq-len", str(S), "--micro-batch-size",
             str(B)]
    yield from runs_in_background(tmp_path_factory.mktemp("oracles"), [], dump=False,
                                  traced={name: (nproc, [*sizes, *flags])
                                          for name, (nproc, flags) in RUNS.items()})


def run_records(runs, name: str) -> list:
    """Each rank's records of run ``name``."""
    return runs[name].result()["records"]


@pytest.fixture
def tp_run(runs):
    return run_records(runs, "tp")


@pytest.fixture
def sp_run(runs):
    return run_records(runs, "sp")


@pytest.fixture
def zb_dp_run(runs):
    return run_records(runs, "zb-dp")


def test_tp_all_reduces_per_microbatch(tp_run):
    L = 2
    for records in tp_run:
        for mb in range(2):
            fwd = comms(records, "all_reduce", label="F", microbatch=mb, group=(0, 1))
            bwd = comms(records, "all_reduce", label="B", microbatch=mb, group=(0, 1))
            assert len(fwd) == 2 * L + 4 and len(bwd) == 2 * L + 1
            assert {r["phase"] for r in fwd} == {"forward"}
            assert {r["phase"] for r in bwd} == {"backward"}
            # 2L layer g's and the embedding's g of s*b*h; 3 cross-entropy ones of s*b
            assert Counter(r["bytes"] for r in fwd) == {S * B * H * FLOAT: 2 * L + 1,
                                                        S * B * FLOAT: 3}
            assert {r["bytes"] for r in bwd} == {S * B * H * FLOAT}
        assert not comms(records, "all_gather") and not comms(records, "reduce_scatter")


def phase_counts(records, group=(0, 1)) -> Counter:
    """(phase, kind) -> collectives of ``group``."""
    return Counter((r["phase"], r["kind"]) for r in records if r["kind"] and r["group"] == group)


def test_sp_collectives_per_layer_and_microbatch(sp_run):
    L, m = 2, 2
    for records in sp_run:
        per_layer = Counter()
        for r in records:
            match = r["kind"] and re.search(r"blocks\.(\d+)\.", r["module"] or "")
            if match:
                per_layer[(int(match.group(1)), r["phase"], r["kind"])] += 1
        for layer in range(L):
            assert per_layer[(layer, "forward", "all_gather")] == 2 * m
            assert per_layer[(layer, "forward", "reduce_scatter")] == 2 * m
            assert per_layer[(layer, "backward", "reduce_scatter")] == 2 * m
            # 2 from the reduce-scatter's backward + 2 re-gathers for the weight gradients
            assert per_layer[(layer, "backward", "all_gather")] == 4 * m
            assert per_layer[(layer, "forward", "all_reduce")] == 0
        # whole micro-batch: + LM head (all-gather; re-gather + reduce-scatter in backward),
        # embedding (all-reduce, split; all-gather in backward), 3 cross-entropy all-reduces
        count = lambda kind, label: len(comms(records, kind, label=label, group=(0, 1)))
        assert (count("all_gather", "F"), count("reduce_scatter", "F"), count("all_reduce", "F")) \
            == ((2 * L + 1) * m, 2 * L * m, 4 * m)
        assert (count("all_gather", "B"), count("reduce_scatter", "B"), count("all_reduce", "B")) \
            == ((4 * L + 2) * m, (2 * L + 1) * m, 0)
        # docs/oracles.md by phase, over the whole iteration: the forward phase holds exactly the
        # forward's collectives; the SP parameters' all-reduce is grad_sync, not forward
        assert phase_counts(records) == {
            ("forward", "all_gather"): (2 * L + 1) * m, ("forward", "reduce_scatter"): 2 * L * m,
            ("forward", "all_reduce"): 4 * m, ("backward", "all_gather"): (4 * L + 2) * m,
            ("backward", "reduce_scatter"): (2 * L + 1) * m, ("grad_sync", "all_reduce"): 1}
        full = S * B * H * FLOAT
        assert {r["bytes"] for r in comms(records, "all_gather", label="F")} == {full // 2}
        assert {r["bytes"] for r in comms(records, "reduce_scatter", label="F")} == {full}
        # LayerNorm weights/biases and row-parallel biases: one TP all-reduce per iteration
        sync = comms(records, "all_reduce", label="grad-sync", group=(0, 1))
        hidden_params = (6 * L + 2) * H  # per layer ln1, ln2 (w, b), proj and fc2 biases; ln_f
        assert len(sync) == 1 and sync[0]["bytes"] == hidden_params * FLOAT


@pytest.mark.parametrize("schedule,v", [("1f1b", 1), ("interleaved", 2)])
def test_pipeline_order_and_p2p_per_stage(runs, schedule, v):
    p, m = 4, 8
    for rank, records in enumerate(run_records(runs, schedule)):
        expected = [str(a) for a in schedule_actions(schedule, stages=p, rank=rank,
                                                     microbatches=m, chunks=v)]
        assert executed_order(records) == expected
        # per micro-batch, every virtual stage sends and receives once per neighbour
        neighbours = sum((c * p + rank > 0) + (c * p + rank < p * v - 1) for c in range(v))
        sends, recvs = comms(records, "send"), comms(records, "recv")
        assert len(sends) == len(recvs) == m * neighbours
        assert {r["peer"] for r in sends + recvs} <= {(rank - 1) % p, (rank + 1) % p}
        assert {r["bytes"] for r in sends + recvs} == {S * B * H * FLOAT}
    if schedule == "1f1b":  # docs/oracles.md: end ranks 8 sends + 8 recvs, middle ranks 16 + 16
        counts = [len(comms(mine, "send")) for mine in run_records(runs, schedule)]
        assert counts == [8, 16, 16, 8]


def _stage_numel(stage: int) -> int:
    cfg = GPTConfig(layers=4, hidden=H, heads=4, seq_len=S, vocab=V)
    chunk = GPTChunk(cfg, layers=range(2 * stage, 2 * stage + 2), first=stage == 0,
                     last=stage == 1, tp=TensorParallel(group=single_process_groups().tp), seed=0)
    return sum(p.numel() for p in chunk.parameters())


def test_zb_h1_with_dp_buckets_and_tied_embedding(zb_dp_run):
    m = 2
    for rank, records in enumerate(zb_dp_run):
        stage, dp_group = rank // 2, (2 * (rank // 2), 2 * (rank // 2) + 1)
        expected = [str(a) for a in schedule_actions("zb-h1", stages=2, rank=stage,
                                                     microbatches=m)]
        assert executed_order(records) == expected
        buckets = comms(records, "all_reduce", label="grad-sync", group=dp_group)
        # every parameter's gradient is all-reduced exactly once per iteration...
        assert sum(r["bytes"] for r in buckets) == _stage_numel(stage) * FLOAT
        assert len(buckets) >= 2 and {r["phase"] for r in buckets} == {"grad_sync"}
        # ...launched from hooks inside the last micro-batch's B or W passes (overlapped)
        outer = [r["annotation"][-2] for r in buckets if len(r["annotation"]) >= 2]
        assert outer and all(a["label"] in ("B", "W") and a["microbatch"] == m - 1
                             for a in outer)
        # the tied word embedding: one all-reduce of V x h between first and last stage
        embedding = comms(records, "all_reduce", label="grad-sync", group=(rank % 2, rank % 2 + 2))
        assert [r["bytes"] for r in embedding] == [V * H * FLOAT]
        assert [r["phase"] for r in embedding] == ["grad_sync"]
        # no collective of a gradient is left in forward or backward, none in the optimizer
        # (the one 8-byte all-reduce left is the reported loss, a float64 scalar)
        grad_groups = (dp_group, (rank % 2, rank % 2 + 2))
        assert not [r for r in records if r["kind"] in ("all_reduce", "reduce_scatter")
                    and r["group"] in grad_groups and r["phase"] != "grad_sync"
                    and r["bytes"] != 8]
