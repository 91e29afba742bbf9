"""tracer.vocab.model_paths: a recorded module path through DDP, FSDP2, checkpoint_wrapper,
DataParallel and torch.compile is the path ``named_modules()`` gives on the bare model. The
oracle is torch itself: each wrapper really wraps a model here, and the recorded name is built
as the recorder builds it (the root's class, then the wrapped model's ``named_modules`` name)."""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from tracer.vocab.model_paths import ModelPath, matches, model_path, unwrap, wrappers_seen


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = nn.Linear(4, 4)


class TinyGPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(4, 4)


@pytest.fixture(scope="module")
def world_of_one():
    """A gloo group of one rank in this process (threads, no process), for DDP and FSDP2."""
    if not dist.is_initialized():
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _wrapped(how):
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    model = TinyGPT()
    if how == "ddp":
        return nn.parallel.DistributedDataParallel(model), {"DDP"}
    if how == "data_parallel":
        return nn.DataParallel(model), {"DataParallel"}
    if how == "compile":
        return torch.compile(model), {"torch.compile"}
    if how == "fsdp2_checkpoint":
        from torch.distributed.fsdp import fully_shard
        model.blocks[0] = checkpoint_wrapper(model.blocks[0])
        for block in model.blocks:
            fully_shard(block)
        fully_shard(model)
        return model, {"FSDP2", "checkpoint_wrapper"}
    raise AssertionError(how)


BARE = {name for name, _ in TinyGPT().named_modules()}


@pytest.mark.parametrize("how", ["ddp", "data_parallel", "compile", "fsdp2_checkpoint"])
def test_every_wrapped_name_unwraps_to_a_bare_name(world_of_one, how):
    wrapped, wrappers = _wrapped(how)
    root = type(wrapped).__name__
    recorded = [f"{root}.{name}" if name else root for name, _ in wrapped.named_modules()]
    assert {model_path(r) for r in recorded} == BARE
    assert set(wrappers_seen(recorded)) == wrappers
    leaf = [r for r in recorded if r.endswith(".mlp")][0]
    assert unwrap(leaf).path == "blocks.0.mlp"


def test_the_model_class_is_kept_where_the_path_says_it():
    assert unwrap("GPT.blocks.3.attn") == ModelPath("blocks.3.attn", "GPT", ())
    assert unwrap("FSDPTinyGPT.head") == ModelPath("head", "TinyGPT", ("FSDP2",))
    # DDP hides the model's class: none is made up
    assert unwrap("DistributedDataParallel.module") == ModelPath("", None, ("DDP",))
    # the wrapper's own ops (outside the model) are the root's
    assert unwrap("DistributedDataParallel") == ModelPath("", None, ("DDP",))
    assert unwrap("(no module)") == ModelPath("(no module)", None, ())
    # accelerate with DeepSpeed (not installed here: the name as DeepSpeedEngine records it)
    assert unwrap("DeepSpeedEngine.module.blocks.0") == ModelPath("blocks.0", None,
                                                                  ("DeepSpeed",))
    # a class that merely starts with FSDP, in lower case after it, is not FSDP2's rename
    assert unwrap("FSDPolicy.a").wrappers == ()


@pytest.mark.parametrize("pattern, path, expected", [
    ("blocks.*", "blocks.3", True),
    ("blocks.*", "blocks.3.mlp", False),
    ("blocks.*", "blocks", False),
    ("layers.*.mlp", "layers.0.mlp", True),
    ("layers.*.mlp", "layers.0.attn", False),
    ("**.mlp", "mlp", True),
    ("**.mlp", "layers.0.mlp", True),
    ("**", "a.b.c", True),
    ("", "", True),
    ("", "blocks", False),
    ("blocks.1?", "blocks.12", True),
    ("blocks.1?", "blocks.1", False),
])
def test_patterns_match_segment_by_segment(pattern, path, expected):
    assert matches(pattern, path) is expected
