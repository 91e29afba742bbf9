"""torch.compile as people write it, under the recorder (docs/phases.md#torchcompile), 2 ranks,
gloo: ``compile(DDP(m))``, ``DDP(compile(m))``, a compiled module inside an eager parent,
``model.compile()``, FSDP2 over compiled blocks and a graph break, in one launch
(tests/scripts/phases_compile_wrapped.py); and nanoGPT's compile path (``compile`` then
``DDP``, gradient accumulation, AdamW, an eval under no_grad) run by trace-run
(tests/scripts/nanogpt_compile.py).

Each script counts what ran with a dispatch mode of its own that runs compiled, under the
recorder (tests/scripts/compiled_counter.py): the trace holds those ops and collectives,
exactly, and nothing of the compilation (Dynamo's tracing on fake tensors, which DDP's path
once recorded as the user's forward)."""
from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest
from torch.utils._python_dispatch import TorchDispatchMode

import tracer
from support.counted_ops import (assert_collectives_match, counted_ops, record_function_ranges,
                                 recorded_ops, region)
from support.gpt_helpers import env, torchrun
from support.paths import REPO, SCRIPTS

# before torch 2.9 Dynamo skips every frame under any dispatch mode: compiled code runs eagerly
pytestmark = pytest.mark.skipif(not hasattr(TorchDispatchMode, "ignore_compile_internals"),
                                reason="this torch runs compiled code eagerly under a mode")

CASES = ("compile-ddp", "ddp-compile", "submodule", "method", "fsdp", "graph-break")
# the module each case's compiled code runs in, as an eager run names it: the models'
# structure in the script (fully_shard renames Net's class FSDPNet; DDP holds it as .module)
CALLED_FROM = {"compile-ddp": {"DistributedDataParallel.module"},
               "ddp-compile": {"DistributedDataParallel.module"},
               "submodule": {"Parent.child"}, "method": {"Net"},
               "fsdp": {"FSDPNet.blocks.0", "FSDPNet.blocks.1"}, "graph-break": {"Branchy"}}


@pytest.fixture(scope="module")
def wrapped(tmp_path_factory):
    out = tmp_path_factory.mktemp("compile_wrapped")
    torchrun("phases_compile_wrapped.py", out)
    return {r: {"records": tracer.load(out / "trace" / f"rank-{r}.arrow").records(),
                "counted": json.loads((out / f"counts-{r}.json").read_text()),
                "graphs": json.loads((out / f"graphs-{r}.json").read_text())}
            for r in range(2)}


@pytest.fixture(scope="module")
def nanogpt(tmp_path_factory):
    out = tmp_path_factory.mktemp("nanogpt")
    proc = subprocess.run([sys.executable, "-m", "instrument.launch", "--nproc-per-node", "2",
                           "--out", str(out / "run"), str(SCRIPTS / "nanogpt_compile.py"),
                           str(out)], cwd=REPO, env=env(), capture_output=True, text=True,
                          timeout=360)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    return {r: {"records": tracer.load(out / "run" / "traces" / f"rank-{r}.arrow").records(),
                "counted": json.loads((out / f"counts-{r}.json").read_text()),
                "graphs": json.loads((out / f"graphs-{r}.json").read_text())}
            for r in range(2)}


def section(records, label, iteration):
    return [e for e in records if e["annotation"] and e["annotation"][0]["label"] == label
            and e["annotation"][0]["iteration"] == iteration]


def test_every_combination_compiles_while_recording(wrapped):
    for r in wrapped.values():
        for label in CASES:
            # Dynamo compiled in the first iteration, under the recorder, and ran warm after
            assert r["graphs"][f"{label}/0"] >= 1, label
            assert r["graphs"][f"{label}/2"] == 0, label
            ranges = [e for e in section(r["records"], label, 2)
                      if e["op"] == "paratrace::annotation" and region(e)
                      and e["annotation"][-1] is region(e)]
            assert {region(e)["pass"] for e in ranges} == {"forward", "backward"}, label
            assert not [e for e in section(r["records"], label, 2)
                        if e["op"] == "aten.addmm.default" and region(e)], label


def test_the_trace_holds_what_ran_and_nothing_of_the_compilation(wrapped):
    for rank, r in wrapped.items():
        for label in CASES:
            for i in range(3):
                records, counted = section(r["records"], label, i), \
                    r["counted"][f"{label}/{i}"]
                where = f"rank {rank} {label}/{i}"
                assert recorded_ops(records) == counted_ops(counted), where
                # Dynamo compiled with every mode off the stack, the counter's too
                assert counted["compiling"] == {}, where
                assert record_function_ranges(records) == counted["ran"].get(
                    "profiler._record_function_enter_new.default", 0), where
        assert not [e for e in r["records"] if e["op"] == "prim.device.default"]


def test_collectives_equal_the_counters_and_sync_gradients(wrapped):
    for rank, r in wrapped.items():
        for label in CASES:
            for i in range(3):
                records = section(r["records"], label, i)
                assert_collectives_match(records, r["counted"][f"{label}/{i}"],
                                         f"rank {rank} {label}/{i}")
        for label in ("compile-ddp", "ddp-compile"):
            (reduce,) = [e for e in section(r["records"], label, 2) if e["kind"]]
            assert (reduce["kind"], reduce["phase"], reduce["module"]) == \
                ("all_reduce", "grad_sync", "DistributedDataParallel")
        fsdp = Counter((e["kind"], e["phase"]) for e in section(r["records"], "fsdp", 2)
                       if e["kind"])
        # root + 2 blocks gathered in forward; 2 again in backward; 3 gradient reductions
        assert fsdp == {("all_gather", "forward"): 3, ("all_gather", "backward"): 2,
                        ("reduce_scatter", "grad_sync"): 3}


def test_compiled_code_carries_the_module_that_called_it(wrapped):
    for r in wrapped.values():
        for label in CASES:
            records = section(r["records"], label, 2)
            inside = [e for e in records if region(e) and e["op"] != "paratrace::annotation"]
            assert {region(e)["module"] for e in inside} == CALLED_FROM[label], label
            assert all(e["module"] == region(e)["module"] for e in inside), label
            assert not [e for e in records if e["module"] and "_orig_mod" in e["module"]]
        backends = {region(e)["backend"] for e in section(r["records"], "compile-ddp", 2)
                    if region(e)}
        assert backends == {"ddp_optimizer(inductor)"}


def test_a_graph_break_runs_eagerly_in_its_true_phase(wrapped):
    for r in wrapped.values():
        records = section(r["records"], "graph-break", 2)
        forwards = [e for e in records if e["op"] == "paratrace::annotation" and region(e)
                    and e["annotation"][-1] is region(e) and region(e)["pass"] == "forward"]
        assert len(forwards) == 2                 # the forward before the branch, and after
        # `if x.sum() > 0` reads the value in Python: eagerly, between the two graphs
        (read,) = [e for e in records if e["op"] == "aten._local_scalar_dense.default"]
        assert not region(read) and (read["phase"], read["module"]) == ("forward", "Branchy")
        assert forwards[0]["t1"] <= read["t0"] and read["t1"] <= forwards[1]["t0"]


def test_nanogpt_compile_path_records_what_ran(nanogpt):
    for rank, r in nanogpt.items():
        assert r["graphs"]["0"] >= 2          # training forward and the eval's, recompiled
        assert r["graphs"]["2"] == 0
        for i in range(3):
            records = [e for e in r["records"] if e["step"] == i]
            counted = r["counted"][str(i)]
            where = f"rank {rank} iteration {i}"
            assert recorded_ops(records) == counted_ops(counted), where
            assert counted["compiling"] == {}, where
            assert_collectives_match(records, counted, where)
        # a record_function range's row comes when it closes: the optimizer's, past the step
        assert record_function_ranges(r["records"]) == sum(
            c["ran"].get("profiler._record_function_enter_new.default", 0)
            for c in r["counted"].values())
        reduces = [e for e in r["records"] if e["kind"] == "all_reduce"]
        assert len(reduces) == 3        # one a step: require_backward_grad_sync on the last
        assert {(e["phase"], e["module"]) for e in reduces} == \
            {("grad_sync", "DistributedDataParallel")}
        inside = [e for e in r["records"] if region(e) and e["op"] != "paratrace::annotation"]
        assert {region(e)["module"] for e in inside} == {"DistributedDataParallel.module"}
        assert {region(e)["backend"] for e in inside} == {"ddp_optimizer(inductor)"}
