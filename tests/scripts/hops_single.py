"""Eager higher-order operators in one process, for ``trace-run --no-launcher`` (no torchrun
environment): torch.cond in a module (forward and backward), while_loop, map, scan,
invoke_subgraph, flex_attention without torch.compile, tag_activation_checkpoint on a traced
GraphModule, and associative_scan (which eager code runs without dispatching its HOP). Each in an
annotation named after it. Writes ENV_JSON: which torchrun variables the script saw, and the
iteration counts the test expects.
Usage: trace-run --no-launcher [--out DIR] hops_single.py ENV_JSON"""
import json
import os
import sys

import torch
import torch.nn as nn
from torch._higher_order_ops.associative_scan import associative_scan
from torch._higher_order_ops.invoke_subgraph import invoke_subgraph
from torch._higher_order_ops.map import map as map_rows
from torch._higher_order_ops.scan import scan
from torch._higher_order_ops.while_loop import while_loop
from torch._higher_order_ops.wrap import tag_activation_checkpoint
from torch.nn.attention.flex_attention import flex_attention
from torch.utils._python_dispatch import TorchDispatchMode

import tracer

LOOPS, ROWS = 3, 4


class Gate(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x):
        return torch.cond(x.sum() > -1e9, lambda t: self.a(t).sin(), lambda t: t.cos(),
                          (x,))                      # COND CALL


class SinCounter(TorchDispatchMode):
    """Counts aten.sin calls, then runs each op on (the recorder's mode, below it)."""
    sins = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.sins += func is torch.ops.aten.sin.default
        return func(*args, **(kwargs or {}))


def causal(score, b, h, q, k):
    return torch.where(q >= k, score, -float("inf"))


torch.manual_seed(0)
gate = Gate()
x = torch.randn(2, 4, requires_grad=True)
with tracer.annotate("cond"):
    gate(x).sum().backward()                         # BACKWARD LINE
with tracer.annotate("while_loop"):
    while_loop(lambda i, t: i < LOOPS, lambda i, t: (i + 1, t * 2),
               (torch.tensor(0), torch.ones(3)))
with tracer.annotate("map"):
    map_rows(lambda row: row * 2, torch.ones(ROWS, 2))
with tracer.annotate("scan"):
    scan(lambda carry, row: (carry + row, carry * 2), torch.zeros(2), torch.ones(ROWS, 2))
with tracer.annotate("invoke_subgraph"):
    invoke_subgraph(lambda a: (a * 2,), "double", torch.ones(2))
with tracer.annotate("flex_attention"):
    q = torch.randn(1, 2, 8, 4)
    flex_attention(q, q, q, score_mod=causal)        # no gradient: eager flex has none on CPU
with tracer.annotate("tag_activation_checkpoint"):
    graph = torch.fx.symbolic_trace(lambda a: a.sin().cos())
    tag_activation_checkpoint(graph, x, use_reentrant=False).sum().backward()
# how often this torch runs the region's sin, counted by a mode of the script's own (torch
# before 2.13 runs an eager tag_activation_checkpoint without checkpointing: no recompute)
with tracer.annotate("count_sin"), SinCounter() as counter:
    tag_activation_checkpoint(torch.fx.symbolic_trace(lambda a: a.sin().cos()), x,
                              use_reentrant=False).sum().backward()
with tracer.annotate("associative_scan"):
    associative_scan(lambda a, b: a + b, torch.ones(5), 0, combine_mode="generic")
seen = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                       "MASTER_PORT", "TORCHELASTIC_RUN_ID")}
with open(sys.argv[1], "w") as fh:
    json.dump({"env": seen, "argv0": sys.argv[0], "loops": LOOPS, "rows": ROWS,
               "checkpoint_sins": counter.sins,
               "distributed": torch.distributed.is_initialized()}, fh)
