"""FSDP2 + tensor parallel with sequence parallelism, as torchtitan composes them for llama
(2 ranks, gloo, a DeviceMesh dp=1 x tp=2): RMSNorms as SequenceParallel, attention and
feed-forward column- then row-parallel with their outputs sharded on the sequence, the embedding
row-parallel, the output column-parallel; fully_shard on each block and the root over dp;
2 AdamW steps. The norms' weights are replicated over tp but see a sequence shard, so their
gradients are Partial: FSDP2's post-backward reshard all-reduces each over tp. A collective
counter of its own (collective_counter.py) counts what ran, and the script writes how many
RMSNorms the model has: OUT/counts-<rank>.json.
Usage: trace-run --nproc-per-node 2 fsdp_tp_sp.py OUT"""
import json
import os
import sys

from collective_counter import CollectiveCounter, rank

counter = CollectiveCounter().install_below()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import fully_shard  # noqa: E402
from torch.distributed.tensor import Replicate, Shard  # noqa: E402
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,  # noqa: E402
                                               RowwiseParallel, SequenceParallel,
                                               parallelize_module)

DIM, HIDDEN, VOCAB, SEQ, LAYERS, STEPS = 16, 32, 32, 8, 2, 2


class Attention(nn.Module):
    """Stands for attention's projections (no softmax: the communication is the point)."""

    def __init__(self):
        super().__init__()
        self.wq, self.wo = nn.Linear(DIM, DIM, bias=False), nn.Linear(DIM, DIM, bias=False)

    def forward(self, x):
        return self.wo(torch.tanh(self.wq(x)))


class FeedForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1, self.w2 = nn.Linear(DIM, HIDDEN, bias=False), nn.Linear(HIDDEN, DIM, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention_norm, self.attention = nn.RMSNorm(DIM), Attention()
        self.ffn_norm, self.feed_forward = nn.RMSNorm(DIM), FeedForward()

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        return h + self.feed_forward(self.ffn_norm(h))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_embeddings = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm, self.output = nn.RMSNorm(DIM), nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))


out = sys.argv[1]
dist.init_process_group("gloo")
torch.manual_seed(0)
mesh = init_device_mesh("cpu", (1, 2), mesh_dim_names=("dp", "tp"))
model = Model()
parallelize_module(model, mesh["tp"], {
    "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
    "norm": SequenceParallel(),
    "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())})
for block in model.layers:
    to_replicated = PrepareModuleInput(input_layouts=(Shard(1),),
                                       desired_input_layouts=(Replicate(),))
    parallelize_module(block, mesh["tp"], {
        "attention_norm": SequenceParallel(), "attention": to_replicated,
        "attention.wq": ColwiseParallel(), "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
        "ffn_norm": SequenceParallel(), "feed_forward": to_replicated,
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1))})
    fully_shard(block, mesh=mesh["dp"])
fully_shard(model, mesh=mesh["dp"])
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
tokens = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(1))
for _ in range(STEPS):
    logits = model(tokens)
    loss = F.cross_entropy(logits.flatten(0, 1), tokens.flatten())
    loss.backward()
    opt.step()
    opt.zero_grad()
counter.dump(os.path.join(out, f"counts-{rank()}.json"))
with open(os.path.join(out, f"model-{rank()}.json"), "w") as fh:
    json.dump({"norms": sum(isinstance(m, nn.RMSNorm) for m in model.modules()),
               "steps": STEPS}, fh)
dist.destroy_process_group()
