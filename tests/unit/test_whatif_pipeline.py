"""A pipeline on any model (``--pp N --split MODULE[,...]``, viz.whatif.model_targets and
viz.whatif.pipeline.pp_stages): the stages a split makes of the model's top-level sequence, and the
targets the recording cannot support refused with one line. The predictions themselves are
checked against real torch.distributed.pipelining runs (tests/integration/
test_whatif_models.py)."""
from __future__ import annotations

import sys

import pytest

from support.paths import SCRIPTS
from tracer.recorder.attribution.parameters import describe
from viz.whatif.model_targets import is_model_target, model_target
from viz.whatif.pipeline.pp_predict import _rows, schedule_order
from viz.whatif.recorded.layout import Layout
from viz.whatif.recorded.setup import Setup
from viz.whatif.reference_gpt.targets import TargetError

sys.path.insert(0, str(SCRIPTS))
from whatif_models import build  # noqa: E402

SETUP = Setup(world=2, dp=2, shard="replicate", dp_group=(0, 1), microbatch_size=4)
# the Llama's top-level sequence as its forward runs it (viz.whatif.pipeline.pp_stages.top_level)
SEQUENCE = ["tok_embeddings", "layers.0", "layers.1", "layers.2", "layers.3", "norm", "output"]


@pytest.fixture(scope="module")
def layout():
    return Layout.from_meta({"DistributedDataParallel.module": describe(build("llama"))})


def target(layout: Layout, changes: dict, setup: Setup = SETUP) -> Setup:
    return model_target(setup, changes, layout, layout.modules(), True, "runs/x", SEQUENCE)


def test_a_split_cuts_the_top_level_sequence_where_stages_begin(layout):
    tgt = target(layout, {"pp": 2, "split": "layers.2", "schedule": "gpipe",
                          "microbatches": 3})
    assert tgt.stages.stages == (("tok_embeddings", "layers.0", "layers.1"),
                                 ("layers.2", "layers.3", "norm", "output"))
    assert (tgt.world, tgt.dp, tgt.shard, tgt.pp, tgt.schedule, tgt.microbatches) == \
        (2, 1, None, 2, "gpipe", 3)
    assert tgt.microbatch_size == 4 and tgt.stages.stage_of("layers.3.attention.wq") == 1
    assert tgt.stages.stage_of("") is None              # the root's own: every stage's
    tgt = target(layout, {"pp": 2, "split": "layers.1,layers.2,layers.3",
                          "schedule": "interleaved", "microbatches": 2})
    assert [s[0] for s in tgt.stages.stages] == ["tok_embeddings", "layers.1", "layers.2",
                                                 "layers.3"]
    assert tgt.config()["virtual_stages"] == 2
    assert tgt.describe() == ("world 2, dp 1, no data parallelism, pp 2 (interleaved, 2 "
                              "micro-batches, 4 stages cut before layers.1, layers.2, "
                              "layers.3), micro-batch size 4")


@pytest.mark.parametrize("changes,message", [
    ({"pp": 2, "split": "blocks.2"}, "--split 'blocks.2' matches no module of the model"),
    ({"pp": 2, "split": "layers.1.attention"},
     "--split: layers.1.attention is not an item of the model's top-level sequence"),
    ({"pp": 2, "split": "tok_embeddings"}, "--split: tok_embeddings is the model's first "
     "module"),
    ({"pp": 4, "split": "layers.2", "dp": 1}, "--pp 4 is more than the 2 stages --split "
     "makes (name 3 modules in --split for --pp 4)"),
    ({"pp": 2, "split": "layers.1,layers.2", "dp": 1}, "--split makes 3 stages (2 cuts), not "
     "a multiple of --pp 2"),
    ({"pp": 8, "split": "layers.*,norm,output", "dp": 1}, "--pp 8 is more than the 7 "
     "stages --split makes"),
    ({"pp": 2, "split": "layers.*,norm,output", "dp": 1}, "--split makes 7 stages (6 cuts), "
     "not a multiple of --pp 2"),
    ({"pp": 4, "split": "layers.2"}, "world size 2 is not a multiple of --pp 4 (name --dp 1 "
     "to predict a world of 4)"),
    ({"pp": 2}, "a pipeline on any model needs --pp N and --split MODULE[,...]"),
    ({"split": "layers.2"}, "a pipeline on any model needs --pp N and --split"),
    ({"pp": 2, "split": "layers.2", "microbatches": 1},
     "--schedule 1f1b needs --microbatches >= --pp 2"),
    ({"pp": 2, "split": "layers.1,layers.2,layers.3", "schedule": "1f1b",
      "microbatches": 4}, "--schedule 1f1b runs one stage a rank: --split makes 4 stages"),
    ({"pp": 2, "split": "layers.2", "schedule": "interleaved", "microbatches": 4},
     "--schedule interleaved runs 2 stages a rank or more"),
    ({"pp": 2, "split": "layers.1,layers.2,layers.3", "schedule": "interleaved",
      "microbatches": 5}, "--microbatches in rounds of 2"),
    ({"pp": 2, "split": "layers.2", "schedule": "zb-h1"}, "--schedule zb-h1: on any model"),
    ({"pp": 2, "split": "layers.2", "dp": 2}, "a pipeline with data parallelism is not "
     "predicted on any model"),
    ({"pp": 2, "split": "layers.2", "shard": "full"}, "--shard with --pp: a pipeline on any "
     "model is predicted alone"),
    ({"pp": 1, "split": "layers.2"}, "--pp 1 with --split: a pipeline needs 2 ranks"),
])
def test_pipelines_the_recording_cannot_support_are_refused(layout, changes, message):
    with pytest.raises(TargetError) as found:
        target(layout, changes)
    assert message in str(found.value) and "\n" not in str(found.value)


def test_a_recorded_pipeline_is_not_split_again(layout):
    recorded = Setup(world=2, pp=2, schedule="1f1b", microbatches=4)
    for changes, message in (({"pp": 2, "split": "layers.3"}, "--split: the recording runs "
                              "a pipeline (pp 2) already: another split is predicted from a "
                              "recording without one"),
                             ({"pp": 4}, "--pp: the recording runs a pipeline (pp 2) "
                              "already"),
                             ({"shard": "full"}, "the recording runs a pipeline (pp 2, 1f1b)")):
        with pytest.raises(TargetError) as found:
            target(layout, changes, recorded)
        assert message in str(found.value)


def test_pipeline_options_on_any_model_are_its_targets():
    assert is_model_target({"pp": 2, "split": "layers.2"}, reference_gpt=False)
    assert is_model_target({"pp": 2}, reference_gpt=False)      # refused there, in one line
    # a recording of torch.distributed.pipelining predicts its schedule as the reference GPT's
    assert not is_model_target({"schedule": "gpipe"}, reference_gpt=False, pipelined=True)
    assert not is_model_target({"pp": 2}, reference_gpt=True)


@pytest.mark.parametrize("schedule,chunks,microbatches", [
    ("gpipe", 1, 3), ("1f1b", 1, 4), ("interleaved", 2, 2), ("interleaved", 2, 4)])
def test_every_message_sent_is_received(schedule, chunks, microbatches):
    """Over the ranks of a predicted pipeline, each stage's sends of a step are its
    neighbour's receives: count and bytes per direction (a cut's own bytes each)."""
    pp = 2
    stages = pp * chunks
    cut_bytes = [1000 * (i + 1) for i in range(stages - 1)]
    tgt = Setup(world=pp, pp=pp, schedule=schedule, microbatches=microbatches)
    tgt.stages = type("Cut", (), {"__len__": lambda self: stages})()
    rows = {r: _rows(r, schedule_order(schedule, pp, r, microbatches, chunks), cut_bytes, tgt)
            for r in range(pp)}
    total = {(row["kind"], row["phase"]): [0, 0] for mine in rows.values() for row in mine}
    for mine in rows.values():
        for row in mine:
            total[(row["kind"], row["phase"])][0] += row["count"]
            total[(row["kind"], row["phase"])][1] += row["bytes"]
    for phase in ("forward", "backward"):
        assert total[("send", phase)] == total[("recv", phase)] == \
            [microbatches * (stages - 1), microbatches * sum(cut_bytes)]
    assert all(row["group"] == [0, 1] and row["dimension"] == "world"
               for mine in rows.values() for row in mine)
