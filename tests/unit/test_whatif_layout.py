"""The parameter layout trace-whatif re-shards (viz.whatif.recorded.layout), from what the
recorder writes of a root module (tracer.recorder.attribution.parameters), against torch's own
computations: its bucket assignment for DDP (torch.distributed._compute_bucket_assignment_by_size),
torch.chunk for FSDP2's shards, the models' named_parameters; and the targets on any model refused
with one line where the recording cannot support them (viz.whatif.model_targets)."""
from __future__ import annotations

import math
import sys

import pytest
import torch
import torch.distributed as dist

from support.paths import SCRIPTS
from tracer.recorder.attribution.parameters import describe
from viz.whatif.model_targets import model_target
from viz.whatif.recorded.layout import Layout, ddp_buckets, fsdp_bytes, zero_partition
from viz.whatif.recorded.setup import Setup
from viz.whatif.reference_gpt.targets import TargetError

sys.path.insert(0, str(SCRIPTS))
from whatif_models import build  # noqa: E402


def layout_of(model: torch.nn.Module, root: str = "DistributedDataParallel.module") -> Layout:
    return Layout.from_meta({root: describe(model)})


@pytest.fixture(scope="module")
def llama():
    return build("llama")


def test_the_recorded_layout_is_the_models_named_parameters(llama):
    layout = layout_of(llama)
    assert [(p.name, p.shape) for p in layout.params] == \
        [(n, tuple(p.shape)) for n, p in llama.named_parameters()]
    assert [b.name for b in layout.buffers] == [n for n, _ in llama.named_buffers()]
    assert layout.buffers[0].nbytes == llama.freqs_cis.numel() * llama.freqs_cis.element_size()


@pytest.mark.parametrize("name,blocks", [
    ("llama", [f"layers.{i}" for i in range(4)]),
    ("gpt2", [f"transformer.h.{i}" for i in range(4)]),
    ("cnn", ["stages.0", "stages.1", "stages.2"])])
def test_default_units_are_the_repeated_blocks_and_the_root(name, blocks):
    assert layout_of(build(name)).units() == blocks + [""]


def test_fsdp_shards_are_torch_chunks_padded():
    gpt2 = build("gpt2")
    layout = layout_of(gpt2)
    wte = next(p for p in layout.params if p.name == "transformer.wte.weight")
    assert wte.shape == (257, 64)                       # an odd vocabulary: padded rows
    for n in (2, 3, 4):
        chunks = torch.chunk(torch.empty(wte.shape), n)
        assert [wte.local_shard(n, r) for r in range(n)] == \
            [c.numel() for c in chunks] + [0] * (n - len(chunks))
        assert wte.padded_shard(n) == chunks[0].numel()
    units = layout.unit_params(layout.units())
    block = units["transformer.h.0"]
    assert fsdp_bytes(block, 2) == sum(torch.chunk(p, 2)[0].numel() * 4
                                       for p in gpt2.transformer.h[0].parameters())
    assert fsdp_bytes(block, 2, "bfloat16") * 2 == fsdp_bytes(block, 2)


def test_ddp_buckets_are_torchs_assignment():
    torch.manual_seed(0)
    sizes = [int(x) for x in torch.randint(1, 400_000, (40,))]
    dtypes = [torch.float32 if i % 7 else torch.float16 for i in range(40)]
    tensors = [torch.empty(n, dtype=d) for n, d in zip(sizes, dtypes)]
    buckets, _ = dist._compute_bucket_assignment_by_size(
        tensors, [1024 * 1024, 25 * 1024 * 1024], [False] * 40, list(range(40)))
    expected = [sum(tensors[i].numel() * tensors[i].element_size() for i in b)
                for b in buckets]
    layout = Layout.from_meta({"M": {"parameters": [
        [f"p{i}", [n], str(d).replace("torch.", ""), True, None, None, None]
        for i, (n, d) in enumerate(zip(sizes, dtypes))], "buffers": []}})
    assert sorted(ddp_buckets(layout.params)) == sorted(expected)
    assert len(expected) > 3


def test_zero_partition_is_largest_first_to_the_least_loaded():
    layout = Layout.from_meta({"M": {"parameters": [
        [f"p{i}", [n], "float32", True, None, None, None]
        for i, n in enumerate([5, 9, 2, 9, 4])], "buffers": []}})
    parts = zero_partition(layout.params, 2)
    # by hand: 9 -> r0, 9 -> r1, 5 -> r0 (tie: the lower rank), 4 -> r1, 2 -> r0 (14 < 13? no)
    assert [[p.name for p in part] for part in parts] == [["p1", "p0"], ["p3", "p4", "p2"]]
    assert sum(p.numel for p in parts[0]) == 14 and sum(p.numel for p in parts[1]) == 15


SETUP = Setup(world=2, dp=2, shard="replicate", dp_group=(0, 1), microbatch_size=4)


@pytest.mark.parametrize("changes,memory,message", [
    ({"checkpoint": "blocks.*"}, True,
     "--checkpoint 'blocks.*' matches no module of the model"),
    ({"shard": "full", "shard_units": "layer.*"}, True,
     "--shard-units 'layer.*' matches no module"),
    ({"param_dtype": "bf16"}, True, "--param-dtype is FSDP2's mixed precision"),
    ({"shard": "full"}, False,
     "--shard is a memory question and runs/x has no memory recorded (it was recorded with "
     "--no-memory: record it without)"),
    ({"no_checkpoint": True}, True, "--no-checkpoint: the recording checkpoints no module"),
    ({"shard_units": "layers.*"}, True, "--shard-units names FSDP2's units: it needs"),
    ({"grad_accum": 0}, True, "--grad-accum must be >= 1"),
])
def test_targets_the_recording_cannot_support_are_refused(llama, changes, memory, message):
    layout = layout_of(llama)
    with pytest.raises(TargetError) as found:
        model_target(SETUP, changes, layout, layout.modules(), memory, "runs/x")
    assert message in str(found.value) and "\n" not in str(found.value)


def test_a_target_names_only_what_it_changes(llama):
    layout = layout_of(llama)
    tgt = model_target(SETUP, {"shard": "full", "param_dtype": "bf16"}, layout,
                       layout.modules(), True)
    assert (tgt.shard, tgt.dp, tgt.param_dtype) == ("full", 2, "bfloat16")
    assert tgt.units == tuple(f"layers.{i}" for i in range(4)) + ("",)
    tgt = model_target(SETUP, {"checkpoint": "layers.*.feed_forward,layers.0"}, layout,
                       layout.modules(), True)
    assert tgt.checkpointed == ("layers.0", "layers.1.feed_forward", "layers.2.feed_forward",
                                "layers.3.feed_forward")
    assert tgt.shard == "replicate" and tgt.microbatch_size == 4
    assert math.isclose(model_target(SETUP, {"dp": 4}, layout, layout.modules(),
                                     False).world, 4)


PLAN = {"layers.*.attention.wq": "colwise", "layers.*.attention.wo": "rowwise"}


@pytest.mark.parametrize("plan,tp,message", [
    ({"layers.*.attn.qkv": "colwise"}, 2, "--tp-plan: 'layers.*.attn.qkv' matches no module"),
    ({"layers.*.attention_norm": "colwise"}, 2,
     "--tp-plan: layers.0.attention_norm is not a linear layer"),
    ({"layers.*.attention.wq": "sequence"}, 2, "the styles are colwise and rowwise"),
    (PLAN, 3, "--tp 3 does not divide layers.0.attention.wq's output features (128)"),
])
def test_tp_plans_the_model_cannot_take_are_refused(llama, plan, tp, message):
    layout = layout_of(llama)
    with pytest.raises(TargetError) as found:
        model_target(SETUP, {"tp": tp, "tp_plan": plan}, layout, layout.modules(), True)
    assert message in str(found.value) and "\n" not in str(found.value)


def test_a_tp_plan_shards_what_torch_shards(llama):
    """The parameters one TP rank holds are the local shards of torch's ColwiseParallel
    and RowwiseParallel: a column-parallel weight's dim 0, a row-parallel weight's dim 1, cut
    as torch.chunk cuts them."""
    from viz.whatif.edits.tp_plan import local_layout
    layout = layout_of(llama)
    tgt = model_target(SETUP, {"tp": 2, "tp_plan": PLAN}, layout, layout.modules(), True)
    assert (tgt.world, tgt.dp, tgt.tp, tgt.shard) == (2, 1, 2, None)
    local = {p.name: p.shape for p in local_layout(layout, tgt.tp_plan).params}
    for name, param in llama.named_parameters():
        dim = {"attention.wq": 0, "attention.wo": 1}.get(name.split(".", 2)[-1][:-7])
        expected = list(param.shape)
        if dim is not None:
            expected[dim] = torch.chunk(param, 2, dim=dim)[0].shape[dim]
        assert list(local[name]) == expected, name


def test_a_dtensor_parameter_is_described_without_dispatching_an_op():
    """The recorder describes a root's parameters inside its first recorded forward: reading
    a DTensor's local shape through to_local() would put a view into the user's trace."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        seen: list = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.seen.append(str(func))
            return func(*args, **(kwargs or {}))
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("tp",))
        linear = torch.nn.Linear(4, 6)
        linear.weight = torch.nn.Parameter(distribute_tensor(linear.weight.detach(), mesh,
                                                             [Shard(0)]))
        with Ops() as ops:
            found = describe(linear)
    finally:
        dist.destroy_process_group()
    assert ops.seen == []
    assert found["parameters"] == [["weight", [6, 4], "float32", True, ["S(0)"], [6, 4],
                                    [["tp"], [1]]],
                                   ["bias", [6], "float32", True, None, None, None]]
