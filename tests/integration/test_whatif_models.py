"""trace-whatif on models written as their communities write them (tests/scripts/
whatif_models.py: a torchtitan-style Llama, transformers' GPT-2 from a GPT2Config, a CNN in
stages), each recorded once under DDP with memory (2 gloo ranks), its other configurations
predicted from that one recording and run for real: ZeRO-1, ZeRO-2, FSDP2, checkpointing,
gradient accumulation, another micro-batch size, another data-parallel degree, for the
Llama tensor parallelism (DTensor's ColwiseParallel and RowwiseParallel on gloo; GPT-2's
Conv1D and the CNN's convolutions are not layers those styles shard), and for the Llama and
the CNN a pipeline (torch.distributed.pipelining: 1F1B, interleaved 1F1B, GPipe). What cannot
depend on the machine's load is asserted: each rank's communications of a step (kind, phase,
group, dimension, count, bytes; FSDP2's padding included) equal the real run's, and its memory
peak is within 5 % of the real one, every category within 5 % of that peak. Step times are a
benchmark (benchmarks/whatif_models.py)."""
from __future__ import annotations

import json
import sys

import pytest

import tracer
from support.cli import run
from support.paths import SCRIPTS
from support.whatif_models import memory_misses, predicted_rows, real_step, record
from tracer.files import rundir
from viz.whatif.recorded.layout import Layout

pytestmark = pytest.mark.integration

WITHIN = 0.05
TP_PLAN = str(SCRIPTS / "llama_tp_plan.json")   # torchtitan's plan for llama, without SP


def pipeline(split: str, schedule: str, microbatches: int) -> tuple:
    """A pipeline target of 2 ranks: (trace-whatif options, whatif_train.py arguments, 2)."""
    options = f"--pp 2 --split {split} --schedule {schedule} --microbatches {microbatches}"
    return options, options.split(), 2
# model -> (its checkpointed modules, {target: (trace-whatif options, whatif_train.py
# arguments, ranks)})
MODELS = {
    "llama": ("layers.*", {
        "zero1": ("--shard optimizer", ["--shard", "optimizer"], 2),
        "zero2": ("--shard gradients", ["--shard", "gradients"], 2),
        "fsdp": ("--shard full", ["--shard", "full"], 2),
        "ckpt": ("--checkpoint layers.*", ["--checkpoint", "layers.*"], 2),
        "accum": ("--grad-accum 2", ["--grad-accum", "2"], 2),
        "batch": ("--microbatch-size 8", ["--microbatch-size", "8"], 2),
        "dp1": ("--dp 1", [], 1),
        "tp": (f"--tp 2 --tp-plan {TP_PLAN}", ["--tp", "2", "--tp-plan", TP_PLAN], 2),
        "pp": pipeline("layers.2", "1f1b", 4),
        "pp_interleaved": pipeline("layers.1,layers.2,layers.3", "interleaved", 2)}),
    "gpt2": ("transformer.h.*", {
        "fsdp": ("--shard full", ["--shard", "full"], 2),
        "ckpt": ("--checkpoint transformer.h.*", ["--checkpoint", "transformer.h.*"], 2),
        "accum": ("--grad-accum 2", ["--grad-accum", "2"], 2),
        "batch": ("--microbatch-size 8", ["--microbatch-size", "8"], 2)}),
    "cnn": ("stages.*", {
        "zero1": ("--shard optimizer", ["--shard", "optimizer"], 2),
        "zero2": ("--shard gradients", ["--shard", "gradients"], 2),
        "fsdp": ("--shard full", ["--shard", "full"], 2),
        "ckpt": ("--checkpoint stages.*", ["--checkpoint", "stages.*"], 2),
        "pp_gpipe": pipeline("stages.1", "gpipe", 3)}),
}
CASES = [(model, target) for model, (_, targets) in MODELS.items() for target in targets]


def whatif(run_dir, out, targets: list) -> dict:
    args = [a for t in targets for a in ("--target", t)]
    proc = run("trace-whatif", run_dir, "--out", out, *args, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((out / "whatif.json").read_text())
    return dict(zip(targets, doc["targets"])) | {"": doc["base"]}


def record_model(model: str, root) -> dict:
    """A model's DDP recording, its predictions of every target, and every target run."""
    targets = MODELS[model][1]
    record(root / "ddp", ["--model", model])
    predicted = whatif(root / "ddp", root / "whatif", [t[0] for t in targets.values()])
    real = {}
    for name, (_, args, ranks) in targets.items():
        record(root / name, ["--model", model, *args], ranks=ranks)
        real[name] = real_step(root / name)
    return {"root": root, "predicted": predicted, "real": real, "base": real_step(root / "ddp")}


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """model -> its runs and predictions, recorded the first time a test asks for them (each
    model's in the first test that uses it: well inside the per-test timeout)."""
    found: dict = {}

    class Runs:
        def __getitem__(self, model: str) -> dict:
            if model not in found:
                found[model] = record_model(model, tmp_path_factory.mktemp(model))
            return found[model]
    return Runs()


@pytest.mark.parametrize("model,target", CASES)
def test_predicted_collectives_equal_the_real_runs(models, model, target):
    options = MODELS[model][1][target][0]
    predicted = models[model]["predicted"][options]["collectives"]
    real = models[model]["real"][target]
    assert sorted(predicted) == sorted(real)
    for rank, mine in real.items():
        assert predicted_rows(predicted[rank]) == mine["comm"], (model, target, rank)


@pytest.mark.parametrize("model,target", CASES)
def test_predicted_memory_is_within_5_percent_by_category(models, model, target):
    options = MODELS[model][1][target][0]
    predicted = models[model]["predicted"][options]["memory"]
    for rank, mine in models[model]["real"][target].items():
        misses = memory_misses(predicted[rank], mine["memory"], WITHIN)
        assert not misses, (model, target, rank, misses)


@pytest.mark.parametrize("model", list(MODELS))
def test_the_recorded_setup_is_read_from_the_recording(models, model):
    sys.path.insert(0, str(SCRIPTS))
    from whatif_models import build
    meta = tracer.load(rundir.trace_file(str(models[model]["root"] / "ddp" / "traces"), 0)).meta
    layout = Layout.from_meta(meta["parameters"])      # what the recorder wrote of DDP's root
    assert [(p.name, p.shape) for p in layout.params] == \
        [(n, tuple(p.shape)) for n, p in build(model).named_parameters()]
    base = models[model]["predicted"][""]
    assert base["setup"].startswith("world 2, dp 2, DDP, micro-batch size 4")
    replayed = base["memory_replayed"]
    for rank, mine in models[model]["base"].items():
        assert not memory_misses(replayed[rank], mine["memory"], 0.0)   # exact


def test_predictions_from_fsdp2_and_checkpointed_recordings(models):
    """The other way round: the real FSDP2 run predicts DDP, the real checkpointed run no
    checkpointing; both compared with the DDP recording."""
    llama = models["llama"]
    root = llama["root"]
    for recorded, options in (("fsdp", "--shard replicate"), ("ckpt", "--no-checkpoint")):
        predicted = whatif(root / recorded, root / f"back-{recorded}", [options])[options]
        for rank, mine in llama["base"].items():
            assert predicted_rows(predicted["collectives"][rank]) == mine["comm"]
            assert not memory_misses(predicted["memory"][rank], mine["memory"], WITHIN)


def test_a_pipelining_recording_says_its_pipeline(models, tmp_path):
    """The pipeline a torch.distributed.pipelining run ran is read from its recording
    (tracer.recorder.frameworks.pipelining's schedule), and another split of it is refused in one
    line."""
    root = models["llama"]["root"]
    proc = run("trace-whatif", root / "pp", "--out", tmp_path / "pp", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    setup = json.loads((tmp_path / "pp" / "whatif.json").read_text())["base"]["setup"]
    assert setup.startswith("world 2, dp 1, no data parallelism, pp 2 (1f1b, 4 micro-batches")
    proc = run("trace-whatif", root / "pp", "--target", "--pp 2 --split layers.3", timeout=600)
    assert proc.returncode == 2
    assert proc.stderr.strip() == ("trace-whatif: error: --split: the recording runs a "
                                   "pipeline (pp 2) already: another split is predicted from a "
                                   "recording without one")


def test_pipelines_the_recording_cannot_support_are_one_line(models, tmp_path):
    """On a recording without a pipeline: a --split naming no module, and a --pp larger than
    the stages the split makes, each one line naming the option, exit status 2."""
    root = models["llama"]["root"]
    for options, message in (
            ("--pp 2 --split blocks.2", "--split 'blocks.2' matches no module of the model"),
            ("--pp 4 --dp 1 --split layers.2", "--pp 4 is more than the 2 stages --split "
             "makes (name 3 modules in --split for --pp 4)")):
        proc = run("trace-whatif", root / "ddp", "--out", tmp_path / "out", "--target",
                   options, timeout=600)
        assert proc.returncode == 2, (options, proc.stderr[-3000:])
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"trace-whatif: error: {message}"), \
            (options, lines)
