"""Three models written the way their communities write them, tiny, for trace-whatif's checks
against real runs (tests/integration/test_whatif_models.py, benchmarks/whatif_models.py):

- ``llama``: a Llama 3 decoder as torchtitan writes it (torchtitan/models/llama3/model.py):
  ``tok_embeddings``, ``layers`` a ModuleDict of TransformerBlocks (``attention.wq/wk/wv/wo``
  with grouped-query heads and complex rotary embeddings from a ``freqs_cis`` buffer,
  ``feed_forward.w1/w2/w3`` SwiGLU, ``attention_norm`` and ``ffn_norm`` RMSNorms), ``norm``,
  ``output``; a pipeline stage is the model with the layers it does not run deleted and its
  ends set to None, as torchtitan's pipeline splitting leaves it;
- ``gpt2``: transformers' GPT2LMHeadModel built from a GPT2Config (no download);
- ``cnn``: a CNN in stages (a stem, a ModuleList of stages of Conv2d + BatchNorm2d + ReLU
  blocks, a pooled linear head), BatchNorm's running statistics being buffers; a pipeline
  stage has its ends set to None and the stages it does not run deleted, as the Llama's.

Every model takes a batch from :func:`batch` and returns its loss through :func:`loss_of`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

MODELS = ("llama", "gpt2", "cnn")


# ----------------------------------------------------------------------------- llama
@dataclass
class LlamaArgs:
    dim: int = 128
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 2
    vocab_size: int = 256
    multiple_of: int = 32
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_seq_len: int = 32


def precompute_freqs_cis(dim: int, end: int, theta: float) -> torch.Tensor:
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: (dim // 2)].float() / dim))
    t = torch.arange(end, device=freqs.device)
    freqs = torch.outer(t, freqs).float()
    return torch.polar(torch.ones_like(freqs), freqs)


def apply_rotary_emb(xq, xk, freqs_cis):
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    freqs_cis = freqs_cis[: xq_.shape[1]].view(1, xq_.shape[1], 1, xq_.shape[-1])
    xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
    xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    bs, slen, n_kv_heads, head_dim = x.shape
    if n_rep == 1:
        return x
    return (x[:, :, :, None, :].expand(bs, slen, n_kv_heads, n_rep, head_dim)
            .reshape(bs, slen, n_kv_heads * n_rep, head_dim))


class Attention(nn.Module):
    def __init__(self, args: LlamaArgs):
        super().__init__()
        self.n_heads = args.n_heads
        self.n_kv_heads = args.n_kv_heads
        self.n_rep = self.n_heads // self.n_kv_heads
        self.head_dim = args.dim // args.n_heads
        self.wq = nn.Linear(args.dim, args.n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(args.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(args.dim, self.n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(args.n_heads * self.head_dim, args.dim, bias=False)

    def forward(self, x, freqs_cis):
        bs, seqlen, _ = x.shape
        xq, xk, xv = self.wq(x), self.wk(x), self.wv(x)
        # -1: the local heads under tensor parallelism
        xq = xq.view(bs, seqlen, -1, self.head_dim)
        xk = xk.view(bs, seqlen, -1, self.head_dim)
        xv = xv.view(bs, seqlen, -1, self.head_dim)
        xq, xk = apply_rotary_emb(xq, xk, freqs_cis)
        keys, values = repeat_kv(xk, self.n_rep), repeat_kv(xv, self.n_rep)
        xq, xk, xv = xq.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2)
        output = F.scaled_dot_product_attention(xq, xk, xv, is_causal=True)
        output = output.transpose(1, 2).contiguous().view(bs, seqlen, -1)
        return self.wo(output)


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden_dim: int, multiple_of: int):
        super().__init__()
        hidden_dim = int(2 * hidden_dim / 3)
        hidden_dim = multiple_of * ((hidden_dim + multiple_of - 1) // multiple_of)
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, layer_id: int, args: LlamaArgs):
        super().__init__()
        self.attention = Attention(args)
        self.feed_forward = FeedForward(args.dim, 4 * args.dim, args.multiple_of)
        self.attention_norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.ffn_norm = nn.RMSNorm(args.dim, eps=args.norm_eps)

    def forward(self, x, freqs_cis):
        h = x + self.attention(self.attention_norm(x), freqs_cis)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, args: LlamaArgs):
        super().__init__()
        self.args = args
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.register_buffer("freqs_cis", precompute_freqs_cis(
            args.dim // args.n_heads, args.max_seq_len * 2, args.rope_theta), persistent=True)
        self.layers = nn.ModuleDict()
        for layer_id in range(args.n_layers):
            self.layers[str(layer_id)] = TransformerBlock(layer_id, args)
        self.norm = nn.RMSNorm(args.dim, eps=args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens) if self.tok_embeddings else tokens
        for layer in self.layers.values():
            h = layer(h, self.freqs_cis)
        h = self.norm(h) if self.norm else h
        return self.output(h) if self.output else h


# ----------------------------------------------------------------------------- gpt2
def gpt2(layers: int = 4) -> nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel
    config = GPT2Config(vocab_size=257, n_positions=32, n_embd=64, n_layer=layers, n_head=4,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)
    return GPT2LMHeadModel(config)


# ----------------------------------------------------------------------------- cnn
class ConvBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int = 1):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x)))


class StagedCNN(nn.Module):
    def __init__(self, widths=(8, 16, 32, 32), classes: int = 10):
        super().__init__()
        self.stem = ConvBlock(3, widths[0])
        self.stages = nn.ModuleList(
            nn.Sequential(ConvBlock(widths[i], widths[i + 1], stride=2),
                          ConvBlock(widths[i + 1], widths[i + 1]))
            for i in range(len(widths) - 1))
        self.head = nn.Linear(widths[-1], classes)

    def forward(self, x):
        # a pipeline stage has its ends set to None, as torchtitan leaves its models' ends
        x = self.stem(x) if self.stem else x
        for stage in self.stages:
            x = stage(x)
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)) if self.head else x


# ----------------------------------------------------------------------------- common
def build(name: str) -> nn.Module:
    torch.manual_seed(0)
    if name == "llama":
        return Transformer(LlamaArgs())
    if name == "gpt2":
        return gpt2()
    if name == "cnn":
        return StagedCNN()
    raise ValueError(f"unknown model {name!r} (one of {', '.join(MODELS)})")


SEQ = 32
IMAGE = 16


def batch(name: str, size: int, seed: int) -> tuple:
    """(inputs, labels) of ``size`` samples, the same for a seed."""
    g = torch.Generator().manual_seed(seed)
    if name == "cnn":
        return torch.randn(size, 3, IMAGE, IMAGE, generator=g), torch.randint(0, 10, (size,),
                                                                              generator=g)
    tokens = torch.randint(0, 256, (size, SEQ + 1), generator=g)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def loss_of(name: str, output, labels) -> torch.Tensor:
    logits = output.logits if hasattr(output, "logits") else output
    if name == "cnn":
        return F.cross_entropy(logits, labels)
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
