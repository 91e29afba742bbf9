"""nanoGPT's compile path (karpathy/nanoGPT's train.py with its defaults compile=True and DDP),
reproduced small, for trace-run (2 ranks, gloo, CPU): a GPT of 2 blocks (LayerNorm, causal
self-attention through scaled_dot_product_attention, a GELU MLP, tied embeddings),
``torch.compile(model)`` then ``DDP(model)``, AdamW with nanoGPT's weight-decay groups, 2
micro-batches of gradient accumulation (``require_backward_grad_sync`` on the last),
``clip_grad_norm_``, and ``estimate_loss`` (eval mode, no_grad: a recompilation) at iteration 0;
3 iterations, each one optimizer step.

A counter of the script's own that runs compiled (compiled_counter.py) counts per iteration,
from after the process group's setup (the recorder's clock alignment is not recorded), what ran:
OUT/counts-<rank>.json; Dynamo's graphs compiled per iteration: OUT/graphs-<rank>.json.
Usage: trace-run --nproc-per-node 2 --out RUN nanogpt_compile.py OUT"""
import json
import math
import os
import sys
from contextlib import nullcontext

import torch
import torch.nn as nn
from torch.distributed import destroy_process_group, init_process_group
from torch.nn import functional as F
from torch._dynamo.utils import counters
from torch.nn.parallel import DistributedDataParallel as DDP

from compiled_counter import CompiledCounter

BLOCK_SIZE, VOCAB, N_LAYER, N_HEAD, N_EMBD = 16, 64, 2, 2, 32
BATCH, ACCUMULATION, EVAL_ITERS, ITERATIONS, GRAD_CLIP = 4, 2, 2, 3, 1.0


class CausalSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn = nn.Linear(N_EMBD, 3 * N_EMBD)
        self.c_proj = nn.Linear(N_EMBD, N_EMBD)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(N_EMBD, dim=2)
        q, k, v = (t.view(B, T, N_HEAD, C // N_HEAD).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_fc, self.gelu = nn.Linear(N_EMBD, 4 * N_EMBD), nn.GELU()
        self.c_proj = nn.Linear(4 * N_EMBD, N_EMBD)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(N_EMBD), CausalSelfAttention()
        self.ln_2, self.mlp = nn.LayerNorm(N_EMBD), MLP()

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(VOCAB, N_EMBD), wpe=nn.Embedding(BLOCK_SIZE, N_EMBD),
            h=nn.ModuleList([Block() for _ in range(N_LAYER)]), ln_f=nn.LayerNorm(N_EMBD)))
        self.lm_head = nn.Linear(N_EMBD, VOCAB, bias=False)
        self.transformer.wte.weight = self.lm_head.weight      # weight tying
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * N_LAYER))

    def forward(self, idx, targets=None):
        pos = torch.arange(0, idx.size(1), dtype=torch.long, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        if targets is None:
            return self.lm_head(x[:, [-1], :]), None
        logits = self.lm_head(x)
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1),
                                       ignore_index=-1)

    def configure_optimizers(self, weight_decay, learning_rate, betas):
        params = [p for p in self.parameters() if p.requires_grad]
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas)   # fused: CUDA only


def get_batch(generator):
    data = torch.randint(VOCAB, (BATCH, BLOCK_SIZE + 1), generator=generator)
    return data[:, :-1].contiguous(), data[:, 1:].contiguous()


out = sys.argv[1]
init_process_group(backend="gloo")
rank = int(os.environ["RANK"])
counter = CompiledCounter().install_below()
counter.section = "0"                       # setup counts with iteration 0 (trace step 0)
torch.manual_seed(1337)
generator = torch.Generator().manual_seed(1337 + rank)
ctx = nullcontext()                         # nanoGPT: no autocast on the CPU
model = GPT()
optimizer = model.configure_optimizers(0.1, 6e-4, (0.9, 0.95))
model = torch.compile(model)
model = DDP(model)


@torch.no_grad()
def estimate_loss():
    model.eval()
    losses = torch.zeros(EVAL_ITERS)
    for k in range(EVAL_ITERS):
        X, Y = get_batch(generator)
        with ctx:
            _, loss = model(X, Y)
        losses[k] = loss.item()
    model.train()
    return losses.mean()


graphs = {}
X, Y = get_batch(generator)
for iter_num in range(ITERATIONS):
    counter.section = str(iter_num)
    before = counters["stats"]["unique_graphs"]
    if iter_num == 0:
        estimate_loss()
    for micro_step in range(ACCUMULATION):
        model.require_backward_grad_sync = (micro_step == ACCUMULATION - 1)
        with ctx:
            logits, loss = model(X, Y)
            loss = loss / ACCUMULATION
        X, Y = get_batch(generator)
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    graphs[str(iter_num)] = counters["stats"]["unique_graphs"] - before
counter.section = None
counter.dump(os.path.join(out, f"counts-{rank}.json"))
with open(os.path.join(out, f"graphs-{rank}.json"), "w") as fh:
    json.dump(graphs, fh)
destroy_process_group()
