"""Reentrant activation checkpointing (``use_reentrant=True``) under DDP, 2 ranks, gloo
(tests/scripts/phases_reentrant.py; docs/phases.md): the checkpoint Function's backward replays
each block, as ``recompute`` on the modules the same ops had in the forward, then runs a backward
of its own through the replay, whose ops carry the modules of the replayed ops that made their
autograd nodes. Before, the replay stayed ``backward`` on the first module the checkpointed
function ran (``blocks.N.ln``), and its backward carried no module.

The script counts what ran with a dispatch mode of its own under the recorder: the trace holds
exactly those ops and collectives."""
from __future__ import annotations

import json
from collections import Counter

import pytest

import tracer
from support.counted_ops import assert_collectives_match, counted_ops, recorded_ops
from support.gpt_helpers import torchrun

NET = "DistributedDataParallel.module"        # the model inside DDP, whose forward checkpoints
BLOCKS = tuple(f"{NET}.blocks.{i}" for i in range(2))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("reentrant")
    torchrun("phases_reentrant.py", out)
    return {r: {"records": tracer.load(out / "trace" / f"rank-{r}.arrow").records(),
                "counted": json.loads((out / f"counts-{r}.json").read_text())}
            for r in range(2)}


def iteration(records, i):
    return [e for e in records if e["annotation"] and e["annotation"][0]["label"] ==
            "reentrant" and e["annotation"][0]["iteration"] == i
            and e["op"] != "paratrace::annotation"]


def in_blocks(e) -> bool:
    return bool(e["module"]) and e["module"].startswith(BLOCKS)


def test_the_replay_is_recompute_on_the_modules_of_the_forward(run):
    for r in run.values():
        for i in range(2):
            records = iteration(r["records"], i)
            forward = [(e["op"], e["module"]) for e in records
                       if e["phase"] == "forward" and in_blocks(e)]
            replay = [(e["op"], e["module"]) for e in records if e["phase"] == "recompute"]
            assert forward and replay
            # the forward ran under no_grad; the replay with grad, which saves tanh's output
            # (a detach): every other replayed op is the forward's, on the same module
            assert Counter(p for p in replay if p[0] != "aten.detach.default") == \
                Counter(forward)
            assert all(module.startswith(BLOCKS) for _, module in replay)
            # the symptom reported: addmm, tanh and add on the block's layer norm
            assert not [e for e in records if e["op"] in (
                "aten.addmm.default", "aten.tanh.default", "aten.add.Tensor")
                and e["module"] and e["module"].endswith(".ln")
                and e["phase"] != "backward"]


def test_the_backward_through_the_replay_carries_the_replayed_modules(run):
    for r in run.values():
        records = iteration(r["records"], 1)
        backward = [e for e in records if e["phase"] == "backward"]
        # the backward kernel of each block op, on the module of the op that made its node
        modules = {op: sorted(e["module"] or "" for e in backward if e["op"] == op)
                   for op in ("aten.tanh_backward.default",
                              "aten.native_layer_norm_backward.default")}
        assert modules["aten.tanh_backward.default"] == list(BLOCKS)
        assert modules["aten.native_layer_norm_backward.default"] == \
            [f"{b}.ln" for b in BLOCKS]
        fc = Counter(e["module"] for e in backward if e["op"] == "aten.mm.default")
        assert fc == {f"{b}.fc": 2 for b in BLOCKS} | {f"{NET}.out": 2, f"{NET}.inp": 1}
        # checkpoint's own backward (detaching its saved input, one a call at least; older
        # torch detaches more there): the module that called it
        own = Counter(e["module"] for e in backward if e["op"] == "aten.detach.default"
                      and e["module"] and not in_blocks(e))
        assert set(own) == {NET} and own[NET] >= 2


def test_the_trace_holds_what_ran(run):
    for rank, r in run.items():
        for i in range(2):
            records = iteration(r["records"], i)
            counted = r["counted"][f"reentrant/{i}"]
            assert recorded_ops(records) == counted_ops(counted), (rank, i)
            assert_collectives_match(records, counted, f"rank {rank} iteration {i}")
        (reduce,) = [e for e in iteration(r["records"], 1) if e["kind"] == "all_reduce"]
        assert (reduce["phase"], reduce["module"]) == ("grad_sync", "DistributedDataParallel")
