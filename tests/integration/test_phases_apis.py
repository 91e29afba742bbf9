"""Phases of real training APIs, recorded in one 2-rank gloo launch (tests/scripts/phases_apis.py):
DDP with no_sync accumulation, FSDP2, non-reentrant activation checkpointing, gradients
all-reduced by hand, collectives outside modules that carry no gradient, an annotation
overriding a phase, optimizer steps with a closure (SGD, LBFGS); collective counts per phase
against torch's CommDebugMode and the closures' own call counts in the same run.
docs/phases.md says what each phase means."""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

import tracer
from support.gpt_helpers import torchrun
from support.paths import SCRIPTS


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("phases")
    torchrun("phases_apis.py", out)
    return {r: (tracer.load(out / f"rank-{r}.arrow").records(),
                json.loads((out / f"comm-debug-{r}.json").read_text())) for r in range(2)}


def section(records, label):
    return [e for e in records if any(a["label"] == label for a in e["annotation"])]


def comm_by_phase(records) -> Counter:
    return Counter((e["phase"], e["kind"]) for e in records if e["kind"])


def test_ddp_setup_is_other_and_only_the_synced_backward_is_grad_sync(run):
    for records, debug in run.values():
        setup = section(records, "ddp-setup")
        assert comm_by_phase(setup) == {("other", "broadcast"): 2, ("other", "all_gather"): 1}
        assert {e["phase"] for e in setup if e["op"] != "paratrace::annotation"} == {"other"}
        # no_sync: the backward accumulates, nothing is communicated
        assert comm_by_phase(section(records, "ddp-accumulate")) == {}
        assert debug["ddp-accumulate"] == {}
        # the last micro-batch: the Reducer's bucket all-reduce, launched from an
        # AccumulateGrad hook inside backward, is grad_sync (one bucket: a tiny model)
        sync = section(records, "ddp-sync")
        assert comm_by_phase(sync) == {("grad_sync", "all_reduce"): 1}
        assert debug["ddp-sync"] == {"allreduce_": 1}
        # the bucket all-reduce belongs to the DDP wrapper that owns the Reducer
        (bucket,) = [e for e in sync if e["kind"] == "all_reduce"]
        assert bucket["module"] == "DistributedDataParallel"
        # DDP's finalize (the autograd engine's final callback) copies the reduced bucket back
        # into the 4 gradients: grad_sync, and nothing of the section is left as "other"
        after = [e for e in sync if e["t0"] > bucket["t0"] and e["op"] != "paratrace::annotation"]
        assert Counter(e["op"] for e in after) == {"aten.as_strided.default": 4,
                                                   "aten.copy_.default": 4}
        assert {e["phase"] for e in after} == {"grad_sync"}
        assert "other" not in {e["phase"] for e in sync if e["op"] != "paratrace::annotation"}
        # loss.backward()'s gradient seed, made before the engine runs: backward, not forward
        assert [e["phase"] for e in sync if e["op"] == "aten.ones_like.default"] == ["backward"]
        ddp_forward = [e for e in section(records, "ddp-sync")
                       if (e["module"] or "").startswith("DistributedDataParallel")
                       and e["op"] == "aten.addmm.default"]
        assert {e["phase"] for e in ddp_forward} == {"forward"} and len(ddp_forward) == 2
        # the SGD step right after: the optimizer phase
        sgd = [e for e in records if e["step"] == 1 and e["phase"] == "optimizer"
               and e["op"] == "aten.add_.Tensor"]
        assert len(sgd) == 4                        # 2 weights + 2 biases


def test_fsdp2_gathers_by_pass_and_reduce_scatters_as_grad_sync(run):
    for records, debug in run.values():
        fsdp = section(records, "fsdp")
        # two fully_shard layers, resharded after forward: gathered again for backward
        assert comm_by_phase(fsdp) == {("forward", "all_gather"): 2,
                                       ("backward", "all_gather"): 2,
                                       ("grad_sync", "reduce_scatter"): 2}
        assert debug["fsdp"] == {"_allgather_base_": 4, "_reduce_scatter_base_": 2}
        assert not comm_by_phase(section(records, "fsdp-setup"))


def test_checkpoint_recompute_carries_the_forward_modules(run):
    for records, _ in run.values():
        ops = [e for e in section(records, "checkpoint") if e["op"] != "paratrace::annotation"]
        addmm = [(e["phase"], e["module"]) for e in ops if e["op"] == "aten.addmm.default"]
        # forward a, b, head; the recomputation replays a (b's output is not saved: early stop)
        assert addmm == [("forward", "Net.blk.a"), ("forward", "Net.blk.b"),
                         ("forward", "Net.head"), ("recompute", "Net.blk.a")]
        recompute = [e for e in ops if e["phase"] == "recompute"]
        assert {e["module"] for e in recompute} == {"Net.blk.a", "Net.blk", "Net.blk.b"}
        assert all(not e["fwd_stack"] for e in recompute)
        assert any(f[2] == "forward" and f[0].endswith("phases_apis.py")
                   for e in recompute for f in e["stack"])
        # the backward still goes to the modules whose forward created its nodes
        mms = Counter(e["module"] for e in ops if e["phase"] == "backward"
                      and e["op"] == "aten.mm.default")
        assert mms == {"Net.head": 2, "Net.blk.b": 2, "Net.blk.a": 1}


def test_gradients_all_reduced_after_backward_are_grad_sync_unless_annotated(run):
    for records, _ in run.values():
        manual = section(records, "manual")
        phases = [e["phase"] for e in manual if e["kind"] == "all_reduce"]
        # weight and bias gradients; the loss (not a gradient: other, grad mode on or not);
        # the annotated report
        assert phases == ["grad_sync", "grad_sync", "other", "other"]


def test_collectives_outside_modules_are_classed_by_what_they_carry(run):
    for records, _ in run.values():
        outside = section(records, "outside")
        # a seed, a parameter (setup), a metric gathered for logging, a barrier: all run with
        # grad mode on, outside modules and the autograd engine; none is the forward pass
        assert comm_by_phase(outside) == {("other", "broadcast"): 2, ("other", "all_gather"): 1,
                                          ("other", "barrier"): 1}
        # the ops around them make no autograd node: data, not the forward pass
        assert {e["phase"] for e in outside if not e["kind"]
                and e["op"] != "paratrace::annotation"} == {"other"}


@pytest.mark.parametrize("name", ["closure-sgd", "closure-lbfgs"])
def test_an_optimizer_closure_keeps_its_forward_backward_and_grad_sync(run, name):
    for records, debug in run.values():
        ops = [e for e in section(records, name) if e["op"] != "paratrace::annotation"]
        calls = debug[name]                    # the closure counted its own calls
        assert calls >= (1 if name == "closure-sgd" else 2)
        by = Counter((e["op"], e["phase"]) for e in ops)
        # per call: 2 Linear forwards, DDP's one bucket all-reduce (grad_sync), 3 matmuls of
        # the backward (the first layer's input needs no gradient)
        assert by[("aten.addmm.default", "forward")] == 2 * calls
        assert by[("aten.mm.default", "backward")] == 3 * calls
        assert comm_by_phase(ops)[("grad_sync", "all_reduce")] == calls
        assert not [e for e in ops if e["kind"] == "all_reduce" and e["phase"] != "grad_sync"]
        assert {e["module"] for e in ops if e["op"] == "aten.addmm.default"} == \
            {"DistributedDataParallel.module.0", "DistributedDataParallel.module.2"}
        # the optimizer phase is the update alone: no forward or backward op is in it, and
        # the update is there (SGD: 4 add_, one per weight and bias)
        update = Counter(e["op"] for e in ops if e["phase"] == "optimizer")
        assert not {"aten.addmm.default", "aten.mm.default", "aten.threshold_backward.default",
                    "aten.relu.default"} & set(update)
        if name == "closure-sgd":
            assert update["aten.add_.Tensor"] == 4
        else:
            assert update["aten.dot.default"] > 0          # LBFGS's two-loop recursion


def test_a_custom_functions_backward_belongs_to_the_line_that_applied_it(run):
    script = str(SCRIPTS / "phases_apis.py")
    lines = Path(script).read_text().splitlines()
    apply_line = next(i + 1 for i, text in enumerate(lines) if "APPLY LINE" in text)
    for records, _ in run.values():
        (backward,) = [e for e in section(records, "function") if e["phase"] == "backward"
                       and e["op"] == "aten.mul.Tensor"]
        # not the helper inside Function.forward, whose op ran first after the node was made
        assert (backward["fwd_stack"][0][0], backward["fwd_stack"][0][1]) == \
            (script, apply_line)
