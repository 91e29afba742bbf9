"""Call graphs of a real traced run of the reference GPT (TP=2 without SP x PP=2, 4 ranks).

Structure checks follow shared/ORACLES.md: the row-parallel linear's forward line holds the
forward all-reduce (g), the backward all-reduce of f is attributed to the column-parallel
forward that created its autograd node, and only the last pipeline stage computes the loss.
The normalized DOT of the merged graph is compared with tests/assets/callgraph_tp2_pp2.dot;
regenerate it after an intended change with ``PARATRACE_UPDATE_GOLDEN=1 pytest
tests/test_callgraph.py``.
"""
from __future__ import annotations

import atexit
import functools
import os
import re
import shutil
import tempfile
from collections import Counter
from pathlib import Path

import pytest
import torch
from torch.utils import flop_counter
from torch.utils.flop_counter import FlopCounterMode

import gpt_helpers
import tracer
from constructed.synthetic import SyntheticRank
from viz.analysis.callgraph import (COMM, FUNCTION, HIDDEN, build_callgraph, function_id, prune,
                           source_lines)
from viz.analysis.op_groups import group_ops
from viz.analysis.flops import flops
from viz.analysis.module_tree import module_tree
from viz.render.callgraph_svg import render_svg, to_dot
from viz.analysis.source import RecordedSources, display_paths, reading
from viz.run import open_run

REPO = Path(__file__).resolve().parent.parent
GOLDEN = REPO / "tests" / "assets" / "callgraph_tp2_pp2.dot"
TP_FILE = str(REPO / "sample_runs" / "parallel" / "tensor_parallel.py")
LAYERS, MICROBATCHES = 2, 2
ARGS = ["--tp", "2", "--no-sp", "--pp", "2", "--schedule", "1f1b", "--layers", str(LAYERS),
        "--hidden", "32", "--heads", "4", "--seq-len", "16", "--micro-batch-size", "2",
        "--microbatches", str(MICROBATCHES), "--steps", "1", "--seed", "7"]


@functools.lru_cache(maxsize=None)
def traced_run() -> str:
    """Trace the reference GPT once per test session (4 real ranks, gloo); returns the run dir.
    test_report.py reuses it."""
    out = tempfile.mkdtemp(prefix="paratrace-callgraph-")
    atexit.register(shutil.rmtree, out, True)
    proc = gpt_helpers.launch(4, [os.path.join(out, "traces"), *ARGS],
                              script=str(REPO / "tests" / "gpt_helpers.py"))
    assert proc.returncode == 0, f"traced run failed:\n{proc.stdout}\n{proc.stderr[-4000:]}"
    return out


@pytest.fixture(scope="module")
def run():
    return open_run(traced_run())


@pytest.fixture(scope="module")
def groups(run):
    return {rank: group_ops(run.load(rank)) for rank in run.files}


@pytest.fixture(scope="module")
def merged(run, groups):
    # definition lines come from the source files the recording hashed (viz.analysis.source)
    with reading(RecordedSources(run.load(r).meta for r in run.files)):
        return build_callgraph([g for r in sorted(groups) for g in groups[r]],
                               world=range(len(run.files)))


def line_of(path: str, text: str) -> int:
    """The only line of ``path`` containing ``text``."""
    hits = [i for i, line in enumerate(Path(path).read_text().splitlines(), 1) if text in line]
    assert len(hits) == 1, f"{text!r} found at lines {hits} of {path}"
    return hits[0]


def test_op_groups_account_for_every_event(run, groups):
    for rank in run.files:
        ops = [r for r in run.load(rank).records() if not r["op"].startswith("paratrace::")]
        assert sum(g.count for g in groups[rank]) == len(ops)
        assert sum(g.bytes for g in groups[rank]) == sum(r["bytes"] or 0 for r in ops)
        assert sum(g.count for g in groups[rank] if g.kind) == sum(1 for r in ops if r["kind"])


def test_row_parallel_forward_line_holds_the_forward_all_reduce(groups, merged):
    line = line_of(TP_FILE, "reduce_from_tensor_parallel_region(partial")
    per_line = source_lines([g for gs in groups.values() for g in gs])[TP_FILE][line]
    forward = per_line.comm.get(("all_reduce", "forward"))
    # g after attn.proj and mlp.fc2: 2 per layer per micro-batch, each layer on 2 ranks.
    assert forward is not None and forward.comms == 2 * LAYERS * MICROBATCHES * 2
    assert ("all_reduce", "backward") not in per_line.comm
    row = merged.functions("RowParallelLinear.forward")[0]
    into = [(b, merged.edge(row.id, b)) for b in merged.graph.successors(row.id)]
    carrying = [b for b, e in into if line in e.lines and e.by_direction["forward"].comms]
    assert [merged.node(b).name for b in carrying] == ["reduce_from_tensor_parallel_region"]


def test_backward_all_reduce_is_attributed_to_the_column_parallel_forward(groups, merged):
    line = line_of(TP_FILE, "copy_to_tensor_parallel_region(x, tp.group)")
    per_line = source_lines([g for gs in groups.values() for g in gs])[TP_FILE][line]
    backward = per_line.comm.get(("all_reduce", "backward"))
    # f before qkv and fc1 (2 per layer per micro-batch, each layer on the 2 ranks of its
    # stage) plus the LM head's f on the 2 ranks of the last stage.
    assert backward is not None
    assert backward.comms == 2 * LAYERS * MICROBATCHES * 2 + MICROBATCHES * 2
    leaves = [n for n in merged.nodes(COMM)
              if n.direction == "backward" and n.kind == "all_reduce"]
    assert leaves, "no backward all-reduce leaf"
    for leaf in leaves:
        caller = next(iter(merged.graph.predecessors(leaf.id)))
        assert merged.node(caller).name == "copy_to_tensor_parallel_region"
        assert any(f.qualname == "_CopyToTensorParallelRegion.backward"
                   for frames in leaf.via for f in frames)
    column = merged.functions("ColumnParallelLinear.forward")[0]
    assert column.by_direction["backward"].comms == 2 * LAYERS * MICROBATCHES * 2


def test_merged_graph_tells_which_ranks_reach_a_node(merged):
    (loss,) = merged.functions("vocab_parallel_cross_entropy")
    assert loss.ranks == (2, 3)          # only the last pipeline stage computes the loss
    (embedding,) = merged.functions("VocabParallelEmbedding.forward")
    assert embedding.ranks == (0, 1)
    (block,) = merged.functions("Block.forward")
    assert block.ranks == (0, 1, 2, 3)
    assert set(block.per_rank) == {0, 1, 2, 3}


def test_inclusive_weights_equal_a_walk_over_every_path(groups, merged):
    node_ops, edge_ops = Counter(), Counter()
    for g in (g for gs in groups.values() for g in gs):
        ids = [function_id(f) for f in g.path]
        for fid in set(ids):
            node_ops[fid] += g.count
        for pair in set(zip(ids, ids[1:])):
            edge_ops[pair] += g.count
    assert {n.id: n.total.ops for n in merged.nodes(FUNCTION)} == dict(node_ops)
    assert {(a, b): merged.edge(a, b).total.ops for a, b in merged.graph.edges()
            if b.startswith("fn:")} == dict(edge_ops)


def test_prune_caps_nodes_and_says_what_it_hid(merged):
    small = prune(merged, max_nodes=25)
    g = small.graph
    assert g.number_of_nodes() <= 25
    assert small.hidden.functions + small.hidden.sites > 0 and small.hidden.ops > 0
    notes = [n for n in small.nodes(HIDDEN)]
    assert notes and all(n.total.ops > 0 for n in notes)
    roots = [n for n in g if g.in_degree(n) == 0]
    assert all(merged.graph.in_degree(n) == 0 for n in roots)   # kept nodes stay connected
    dot = to_dot(small, title="t", paths={}, href=lambda f, l: None)
    assert "hidden for readability" in dot and "+" in dot


def normalize_dot(text: str) -> str:
    """DOT without what varies between machines and runs: absolute paths, timings, time-based
    colours and widths, line numbers (sample_runs is edited while the graph stays)."""
    text = text.replace(str(REPO) + "/", "")
    text = re.sub(r"\d+(\.\d+)? (ns|us|ms|s)\b", "T", text)
    text = re.sub(r"\d+% of time", "P% of time", text)
    text = re.sub(r"penwidth=\"?[\d.]+\"?", "penwidth=P", text)
    text = re.sub(r"/oranges9/\d", "/oranges9/H", text)
    text = re.sub(r"fontcolor=(white|black)", "fontcolor=F", text)
    text = re.sub(r"(\.py|\w):\d+", r"\1:N", text)
    text = re.sub(r"#L\d+", "#L", text)
    text = re.sub(r"(ops at line|call lines) [\d, ]+", r"\1 N", text)
    return text


def test_golden_dot(merged):
    files = {n.file for n in merged.nodes() if n.file}
    files |= {f.file for n in merged.nodes() for f in n.boundaries}
    # Prune by ops and bytes only: those are the same in every run of this configuration.
    pruned = prune(merged, measures=("ops", "bytes"))
    dot = to_dot(pruned, title="tp2 x pp2 all ranks", paths=display_paths(files),
                 href=lambda f, l: f"../source/x.html#L{l}")
    text = normalize_dot(dot)
    if os.environ.get("PARATRACE_UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(text)
    assert text == GOLDEN.read_text(), "call graph changed; PARATRACE_UPDATE_GOLDEN=1 updates it"
    svg = render_svg(dot)
    assert svg.count('class="node"') == pruned.graph.number_of_nodes() + 6   # + legend
    assert "#1565c0" in svg and "legend" in svg and "<title>" in svg


def test_module_view(groups):
    rows = {r.path: r for r in module_tree([g for gs in groups.values() for g in gs])}
    chunk = rows["GPTChunk"]
    assert chunk.total.ops == sum(c.total.ops for c in chunk.children) + chunk.own.ops
    assert rows["GPTChunk.head"].ranks == (2, 3)
    # forward x @ W^T on (s*b, h) x (h, 3h/t): 2*s*b*h*3h/t per micro-batch on each rank of the
    # stage holding the layer: layer 0 on stage 0 (ranks 0, 1), layer 1 on stage 1 (ranks 2, 3)
    s, b, h, t = 16, 2, 32, 2
    for layer, ranks in ((0, (0, 1)), (1, (2, 3))):
        qkv = rows[f"GPTChunk.blocks.{layer}.attn.qkv"]
        assert qkv.ranks == ranks
        assert qkv.by_direction["forward"].flops == \
            2 * s * b * h * (3 * h // t) * MICROBATCHES * 2
        assert qkv.comm[("all_reduce", "backward")].comms == MICROBATCHES * 2


@pytest.mark.parametrize("op,make", [
    (torch.ops.aten.mm.default, lambda: (torch.randn(8, 5), torch.randn(5, 3))),
    (torch.ops.aten.addmm.default, lambda: (torch.randn(3), torch.randn(8, 5),
                                            torch.randn(5, 3))),
    (torch.ops.aten.bmm.default, lambda: (torch.randn(2, 8, 5), torch.randn(2, 5, 3))),
    (torch.ops.aten.baddbmm.default, lambda: (torch.randn(2, 8, 3), torch.randn(2, 8, 5),
                                              torch.randn(2, 5, 3))),
])
def test_flops_match_torch_flop_counter(op, make):
    args = make()
    with FlopCounterMode(display=False) as counter:
        op(*args)
    assert flops(str(op), _shapes(args)) == counter.get_total_flops() > 0


@pytest.mark.parametrize("q,k,v", [((2, 4, 16, 8), (2, 4, 16, 8), (2, 4, 16, 8)),
                                   ((1, 8, 12, 16), (1, 2, 20, 16), (1, 2, 20, 24))])
def test_attention_flops_match_torch_formulas(q, k, v):
    # FlopCounterMode has no entry for the CPU flash kernel: compare with its formulas.
    grad = q[:3] + v[3:]
    assert flops("aten._scaled_dot_product_flash_attention_for_cpu.default", text(q, k, v)) \
        == flop_counter.sdpa_flop_count(q, k, v)
    logsumexp = q[:3]
    assert flops("aten._scaled_dot_product_flash_attention_for_cpu_backward.default",
                 text(grad, q, k, v, grad, logsumexp)) \
        == flop_counter.sdpa_backward_flop_count(grad, q, k, v)


def test_flops_without_formula_or_readable_shapes_are_zero():
    assert flops("aten.add.Tensor", "f32[4,4] f32[4,4]") == 0
    assert flops("aten.mm.default", "junk") == 0
    assert flops("aten.mm.default", None) == 0
    assert flops("aten.mm.default", "f32[4,4]") == 0      # an input missing


def _shapes(args) -> str:
    return text(*(a.shape for a in args))


def text(*shapes) -> str:
    """A recorded shapes string: ``f32[2,4] f32[4]``."""
    return " ".join(f"f32[{','.join(str(d) for d in s)}]" for s in shapes)


def test_trace_without_stacks_still_graphs(tmp_path):
    """A recording made with record_stacks=False (or a foreign trace) has null stacks."""
    r = SyntheticRank(0, 1, unit_ns=1)
    r.op(0, 10, module="M", shapes="f32[4,4] f32[4,4]")
    r.comm("all_reduce", 20, 20, 50, group=(0, 1), nbytes=64, module="M", phase="forward")
    trace = tracer.load(r.write(tmp_path))
    cg = build_callgraph(group_ops(trace))
    (root,) = cg.nodes(FUNCTION)
    assert root.name == "(no stack recorded)" and root.total.ops == 2 and root.total.bytes == 64
    assert root.total.flops == 2 * 4 * 4 * 4
    assert "<svg" in render_svg(to_dot(prune(cg), title="t", paths={}, href=lambda f, l: None))
