"""Real training frameworks traced unchanged by ``trace-run`` (2 ranks, gloo, tiny configs, no
download; docs/traced-frameworks.md): the Hugging Face Trainer on a GPT-2 built from a
GPT2Config (DDP through accelerate), Lightning's BoringModel (DDP, its default loop runs forward
and backward inside ``optimizer.step(closure)``), and FSDP2 + TP with sequence parallelism
(a torchtitan-style llama block of our own). One launch per framework, shared by its tests.

Each script counts its collectives with a dispatch mode of its own under the recorder
(tests/scripts/collective_counter.py): the recorded counts must equal them. Phases follow
docs/phases.md; stacks reach into the framework's own files (site-packages is the user's code
by default), and still end at the call into torch."""
from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

import tracer
from support.gpt_helpers import env
from support.paths import REPO, SCRIPTS

P2P = ("send", "recv")      # the recorder's clock alignment: the counter sees it, unrecorded


def traced(name: str, out: Path) -> dict:
    """trace-run --nproc-per-node 2 SCRIPT OUT; the traces, counts and report of both ranks."""
    offline = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "-m", "instrument.launch", "--nproc-per-node", "2",
                           "--out", str(out / "run"), str(SCRIPTS / name), str(out)], cwd=REPO,
                          env={**env(), **offline}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    ranks = {}
    for r in range(2):
        trace = tracer.load(out / "run" / "traces" / f"rank-{r}.arrow")
        ranks[r] = {"trace": trace, "records": trace.records(),
                    "counted": json.loads((out / f"counts-{r}.json").read_text())}
    return {"out": out / "run", "ranks": ranks, "proc": proc}


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    return traced("hf_trainer.py", tmp_path_factory.mktemp("hf"))


@pytest.fixture(scope="module")
def lightning(tmp_path_factory):
    return traced("lightning_ddp.py", tmp_path_factory.mktemp("lightning"))


@pytest.fixture(scope="module")
def fsdp_tp(tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp_tp")
    run = traced("fsdp_tp_sp.py", out)
    run["model"] = json.loads((out / "model-0.json").read_text())
    return run


def collectives(records) -> list:
    return [e for e in records if e["kind"]]


def assert_counts_match(run) -> None:
    """The recorded collectives, kind by kind, equal the script's own count; and those in
    backward phases (backward, grad_sync) equal the ones it saw launched while the autograd
    engine ran, its final callbacks included (none of these runs syncs gradients by hand after
    backward)."""
    for rank, mine in run["ranks"].items():
        counted = mine["counted"]
        assert counted["unknown"] == {}, counted["unknown"]
        comm = [e for e in collectives(mine["records"]) if e["kind"] not in P2P]
        assert Counter(e["kind"] for e in comm) == \
            {k: n for k, n in counted["counts"].items() if k not in P2P}, rank
        assert Counter(e["kind"] for e in comm if e["phase"] in ("backward", "grad_sync")) == \
            {k: n for k, n in counted["in_backward"].items() if k not in P2P}, rank


def files_of(stack) -> list:
    return [frame[0] for frame in stack or ()]


def in_package(file: str, part: str) -> bool:
    return f"site-packages/{part}" in file


# ------------------------------------------------------------------ Hugging Face Trainer
def test_hf_trainer_collectives_equal_an_independent_count(hf):
    assert_counts_match(hf)


def test_hf_trainer_phases(hf):
    for mine in hf["ranks"].values():
        comm = collectives(mine["records"])
        # DDP's bucket all-reduces, from the gradients' hooks inside backward: grad_sync, on the
        # DDP wrapper; as many as the counter saw launched inside backward
        buckets = [e for e in comm if e["kind"] == "all_reduce"]
        assert {(e["phase"], e["module"]) for e in buckets} == \
            {("grad_sync", "DistributedDataParallel")}
        assert len(buckets) == mine["counted"]["in_backward"]["all_reduce"]
        # the rest run outside modules and backward: DDP's setup broadcasts, the logging
        # gathers of the loss and the FLOPs (nested_gather, store_flos): none is the forward
        rest = Counter((e["kind"], e["phase"]) for e in comm if e["kind"] != "all_reduce")
        assert set(rest) == {("broadcast", "other"), ("all_gather", "other")}
        gathers = [e for e in comm if e["kind"] == "all_gather"]
        assert any(in_package(f, "transformers/trainer_pt_utils.py")
                   for e in gathers for f in files_of(e["stack"]))
        # the model's matmuls: forward in GPT-2's modules, backward by the forward's module
        phases = Counter(e["phase"] for e in mine["records"] if e["op"] == "aten.addmm.default")
        assert phases["forward"] > 0 and "optimizer" not in phases
        optimizer = {e["op"] for e in mine["records"] if e["phase"] == "optimizer"}
        assert optimizer and not optimizer & {"aten.addmm.default", "aten.mm.default",
                                              "aten.bmm.default"}


def test_hf_trainer_stacks_reach_modeling_gpt2_and_end_at_torch(hf):
    for mine in hf["ranks"].values():
        attention = [e for e in mine["records"] if e["op"] == "aten.addmm.default"
                     and e["phase"] == "forward" and e["module"].endswith("attn.c_attn")]
        assert attention
        for e in attention:
            files = files_of(e["stack"])
            # transformers' own frames down to the call into torch: Conv1D.forward calls
            # torch.addmm (C, no frame of torch's); torch's frames are folded into that call
            assert e["stack"][0][3] == "Conv1D.forward"
            assert in_package(files[0], "transformers/pytorch_utils.py")
            assert not any(in_package(f, "torch/") for f in files)
            assert any(in_package(f, "transformers/models/gpt2/modeling_gpt2.py")
                       for f in files)
            assert any(f[3] == "GPT2Attention.forward" for f in e["stack"])
        # a backward op is attributed to the forward line in modeling_gpt2.py that made it
        assert any(in_package(f, "transformers/models/gpt2/modeling_gpt2.py")
                   for e in mine["records"] if e["phase"] == "backward"
                   for f in files_of(e["fwd_stack"]))
        library = mine["trace"].meta["library"]
        assert not any("transformers" in p for p in library["library"])


def test_hf_trainer_report_shows_the_models_functions(hf):
    graph = (hf["out"] / "callgraphs" / "all.svg").read_text()
    for function in ("GPT2Attention.forward", "GPT2MLP.forward", "GPT2Block.forward"):
        assert function in graph
    assert "modeling_gpt2.py" in graph
    front = (hf["out"] / "index.html").read_text()
    # the front page's files: the modeling code (not only the script's trainer.train() line)
    assert "transformers/models/gpt2/modeling_gpt2.py" in front
    modules = (hf["out"] / "modules.html").read_text()
    zoom = next(p for p in sorted((hf["out"] / "callgraphs").glob("mod-*.svg")))
    assert "callgraphs/mod-" in modules and "GPT2Attention.forward" in zoom.read_text()


# ------------------------------------------------------------------ Lightning
def test_lightning_collectives_equal_an_independent_count(lightning):
    assert_counts_match(lightning)


def test_lightning_closure_keeps_forward_backward_and_grad_sync(lightning):
    for mine in lightning["ranks"].values():
        records = mine["records"]
        step = [e for e in records if any(a["label"].startswith("Optimizer.step#")
                                          for a in e["annotation"])
                and e["op"] != "paratrace::annotation"]
        by = Counter((e["op"], e["phase"]) for e in step)
        # the closure runs training_step (forward), backward and DDP's bucket all-reduce
        assert by[("aten.addmm.default", "forward")] == 2            # one per step
        assert by[("aten.mm.default", "backward")] == 2
        buckets = [e for e in step if e["kind"] == "all_reduce"]
        assert len(buckets) == mine["counted"]["in_backward"]["all_reduce"] == 2
        assert {(e["phase"], e["module"]) for e in buckets} == \
            {("grad_sync", "DistributedDataParallel")}
        # the optimizer phase is SGD's update alone: one add_ per parameter (weight, bias)
        update = Counter(e["op"] for e in step if e["phase"] == "optimizer")
        assert update == {"aten.add_.Tensor": 4}
        # Lightning's own metric reductions and barriers, outside modules: other
        outside = [e for e in collectives(records) if e["kind"] in ("barrier", "all_reduce")
                   and e not in buckets]
        assert outside and {e["phase"] for e in outside} == {"other"}
        # DDP's bucket rebuild in the second step's forward broadcasts the bucket layout
        # (integers) from inside the DDP module: setup, as the constructor's, not the forward
        rebuild = [e for e in collectives(records) if e["kind"] == "broadcast"
                   and e["module"] == "DistributedDataParallel"]
        assert len(rebuild) == 2 and {e["dtype"] for e in rebuild} == {"i32"}
        assert {e["phase"] for e in collectives(records) if e["kind"] == "broadcast"} == {"other"}


def test_lightning_stacks_reach_the_lightning_module(lightning):
    for mine in lightning["ranks"].values():
        forward = [e for e in mine["records"] if e["op"] == "aten.addmm.default"
                   and e["phase"] == "forward"]
        for e in forward:
            assert e["module"] == "DistributedDataParallel.module.layer"
            assert in_package(e["stack"][0][0], "torch/nn/modules/linear.py")
            assert any(in_package(f[0], "lightning/pytorch/demos/boring_classes.py")
                       and f[3] == "BoringModel.forward" for f in e["stack"])
    graph = (lightning["out"] / "callgraphs" / "all.svg").read_text()
    assert "BoringModel.training_step" in graph and "boring_classes.py" in graph


# ------------------------------------------------------------------ FSDP2 + TP + SP
def test_fsdp_tp_sp_collectives_equal_an_independent_count(fsdp_tp):
    assert_counts_match(fsdp_tp)


def test_fsdp_tp_sp_norm_gradient_all_reduces_are_grad_sync(fsdp_tp):
    model = fsdp_tp["model"]
    for mine in fsdp_tp["ranks"].values():
        reduces = [e for e in collectives(mine["records"]) if e["kind"] == "all_reduce"]
        # one per RMSNorm weight (Partial over tp: it saw a sequence shard) per step, issued by
        # FSDP2's post-backward reshard inside backward
        assert len(reduces) == model["norms"] * model["steps"] == \
            mine["counted"]["in_backward"]["all_reduce"]
        assert {(e["phase"], e["group"]) for e in reduces} == {("grad_sync", (0, 1))}
        assert all(any(a["label"].startswith("FSDP::post_backward_reshard")
                       for a in e["annotation"]) for e in reduces)
        # sequence parallelism's gathers and scatters stay in the passes
        kinds = Counter((e["kind"], e["phase"]) for e in collectives(mine["records"]))
        assert kinds[("all_gather", "forward")] > 0 and kinds[("all_gather", "backward")] > 0
        assert kinds[("reduce_scatter", "forward")] > 0
        assert kinds[("reduce_scatter", "backward")] > 0


def test_fsdp_tp_sp_weight_scatters_match_across_ranks(fsdp_tp):
    """parallelize_module scatters each weight from rank 0: the receivers hand no bytes but
    receive the root's dtype, so cross-rank analysis matches them without a false mismatch."""
    summary = json.loads((fsdp_tp["out"] / "summary.json").read_text())
    scatters = [e for mine in fsdp_tp["ranks"].values() for e in collectives(mine["records"])
                if e["kind"] == "scatter"]
    assert scatters and {e["phase"] for e in scatters} == {"other"}
    assert "mismatch" not in fsdp_tp["proc"].stderr
    assert summary["cross_rank"].get("mismatches", []) == []
