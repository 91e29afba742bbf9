"""A tiny GPT (2 blocks of attention and MLP, hidden 16) trained with AdamW under DDP or FSDP2
(2 ranks, gloo), unaware of paratrace: the same model code wrapped two ways, for trace-diff's
tests (tests/integration/test_diff_wrappers.py) and the README's DDP-to-FSDP2 diff.
Usage: trace-run --nproc-per-node 2 tiny_gpt_train.py --wrap ddp|fsdp2 [--steps N]
[--checkpoint] (--checkpoint: each block in checkpoint_wrapper, its activations recomputed)"""
import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

VOCAB, HIDDEN, HEADS, SEQ, BATCH, LAYERS = 32, 16, 2, 8, 2, 2


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(HIDDEN, 3 * HIDDEN)
        self.proj = nn.Linear(HIDDEN, HIDDEN)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = (part.view(b, t, HEADS, HIDDEN // HEADS).transpose(1, 2)
                   for part in self.qkv(x).split(HIDDEN, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, HIDDEN))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(HIDDEN, 4 * HIDDEN)
        self.fc2 = nn.Linear(4 * HIDDEN, HIDDEN)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(HIDDEN), nn.LayerNorm(HIDDEN)
        self.attn, self.mlp = Attention(), MLP()

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.head = nn.Linear(HIDDEN, VOCAB)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x.reshape(-1, HIDDEN))     # 2-D: not a view (FSDP2 warns of those)


def wrapped(how: str, checkpoint: bool) -> nn.Module:
    torch.manual_seed(0)
    model = TinyGPT()
    if checkpoint:
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import \
            checkpoint_wrapper
        for i, block in enumerate(model.blocks):
            model.blocks[i] = checkpoint_wrapper(block)
    if how == "ddp":
        return nn.parallel.DistributedDataParallel(model)
    from torch.distributed.fsdp import fully_shard
    for block in model.blocks:
        fully_shard(block)
    fully_shard(model)
    return model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--wrap", choices=("ddp", "fsdp2"), required=True)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--checkpoint", action="store_true")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = wrapped(args.wrap, args.checkpoint)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.Generator().manual_seed(rank)
    for _ in range(args.steps):
        tokens = torch.randint(VOCAB, (BATCH, SEQ + 1), generator=data)
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits, tokens[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
