"""Call graphs of a real traced run of the reference GPT (TP=2 without SP x PP=2, 4 ranks).

Structure checks follow docs/oracles.md: the row-parallel linear's forward line holds the
forward all-reduce (g), the backward all-reduce of f is attributed to the column-parallel
forward that created its autograd node, and only the last pipeline stage computes the loss.
The merged graph is held against what the test derives apart from the call-graph code: its
functions, calls and inclusive counts against the trace's own rows counted here; every call it
draws against the calls Python's profiling hook saw in the same processes (traced_runs
``--calls``); its collectives against the oracle's counts; the pruned graph's notes against
what it hid; every drawn node's link against the source line it names.
"""
from __future__ import annotations

import re
from collections import Counter, defaultdict
from pathlib import Path

import networkx as nx
import pytest
import torch
from torch.utils import flop_counter
from torch.utils.flop_counter import FlopCounterMode

import tracer
from support.paths import line_of
from support.traced_runs import LAYERS, MICROBATCHES, OWN_CODE, TP_FILE, read_calls
from support.constructed.synthetic import SyntheticRank
from viz.analysis.callgraphs.callgraph import (COMM, FUNCTION, HIDDEN, build_callgraph,
                                               function_id, prune, source_lines)
from viz.analysis.callgraphs.op_groups import group_ops
from viz.analysis.callgraphs.flops import flops
from viz.analysis.callgraphs.module_tree import module_tree
from viz.render.callgraph_svg import render_svg, to_dot
from viz.analysis.callgraphs.source_files import RecordedSources, display_paths, reading
from viz.run import open_run

WORLD = range(4)
STAGES = {0: (0, 1), 1: (2, 3)}          # pipeline stage -> its TP ranks (tp is fastest)


@pytest.fixture(scope="module")
def run(callgraph_run):
    return open_run(str(callgraph_run))


@pytest.fixture(scope="module")
def groups(run):
    return {rank: group_ops(run.load(rank)) for rank in run.files}


@pytest.fixture(scope="module")
def merged(run, groups):
    # definition lines come from the source files the recording hashed
    # (viz.analysis.callgraphs.source_files)
    with reading(RecordedSources(run.load(r).meta for r in run.files)):
        return build_callgraph([g for r in sorted(groups) for g in groups[r]],
                               world=range(len(run.files)))


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
    """The pipeline's layout (sample_runs/model.py): the embedding on stage 0, the head and the
    loss only on the last stage, a block on each, the P2P and the tied embedding's all-reduce
    on both."""
    for name, stages in (("Embedding.forward", (0,)), ("VocabParallelEmbedding.forward", (0,)),
                         ("LMHead.forward", (1,)), ("vocab_parallel_cross_entropy", (1,)),
                         ("Block.forward", (0, 1)), ("RowParallelLinear.forward", (0, 1)),
                         ("PipeChannels.send", (0, 1)),
                         ("all_reduce_tied_embedding_grads", (0, 1))):
        (node,) = merged.functions(name)
        assert node.ranks == tuple(r for s in stages for r in STAGES[s]), name
    (block,) = merged.functions("Block.forward")
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


# ------------------------------------------------------------------------------ the graph's shape
def own(file: str) -> bool:
    """The run's own code (sample_runs/ and the traced script); torch and the stdlib are not."""
    return file.startswith(OWN_CODE)


@pytest.fixture(scope="module")
def rows(callgraph_run) -> list:
    """(rank, attribution path, record) of every event of every rank, pseudo ops left out;
    the path is the own frames, outermost first, as (file, qualname, line), of the stack that
    created the event's autograd node where the trace has one (a backward op), else of its
    live stack. Read from the trace files here, apart from viz.analysis.callgraphs.op_groups."""
    out = []
    for rank in WORLD:
        trace = tracer.load(str(callgraph_run / "traces" / f"rank-{rank}.arrow"))
        for record in trace.records():
            if record["op"].startswith("paratrace::"):
                continue
            frames = record["fwd_stack"] or record["stack"]
            path = tuple((f[0], f[3], f[1]) for f in reversed(frames) if own(f[0]))
            assert path, f"an event with no frame of the run's own code: {record}"
            out.append((rank, path, record))
    return out


def test_functions_calls_and_counts_are_the_recorded_stacks(rows, merged):
    """A node per function of the events' paths, an edge per caller -> callee pair in them,
    each weighing the events (per rank, and bytes) whose path goes through it."""
    ops, nbytes, edge_ops = defaultdict(Counter), Counter(), Counter()
    for rank, path, record in rows:
        functions = [(file, name) for file, name, _ in path]
        for fn in set(functions):
            ops[fn][rank] += 1
            nbytes[fn] += record["bytes"] or 0
        for pair in set(zip(functions, functions[1:])):
            edge_ops[pair] += 1
    nodes = {(n.file, n.name): n for n in merged.nodes(FUNCTION)}
    assert set(nodes) == set(ops)
    for fn, node in nodes.items():
        assert {r: w.ops for r, w in node.per_rank.items() if w.ops} == dict(ops[fn]), fn
        assert node.total.bytes == nbytes[fn], fn
    fn_edges = [(merged.node(a), merged.node(b)) for a, b in merged.graph.edges()
                if merged.node(b).type == FUNCTION]
    assert {((a.file, a.name), (b.file, b.name)): merged.edge(a.id, b.id).total.ops
            for a, b in fn_edges} == dict(edge_ops)
    assert merged.total.ops == len(rows)


def test_every_call_drawn_is_a_call_the_run_made(callgraph_run, merged):
    """Python's profiling hook, in the traced processes, saw each call between the run's own
    functions (torch's frames between them skipped, as the graph skips them): every function
    and every caller -> callee of the graph is one of them, on each rank the graph says."""
    calls = read_calls(callgraph_run / "traces")
    assert sorted(calls) == list(WORLD)
    called = {r: {callee for _, callee in edges} for r, edges in calls.items()}
    for node in merged.nodes(FUNCTION):
        for rank in node.ranks:
            assert (node.file, node.name) in called[rank], (node.name, rank)
    for a, b in merged.graph.edges():
        caller, callee = merged.node(a), merged.node(b)
        if callee.type != FUNCTION:
            continue
        for rank in merged.edge(a, b).per_rank:
            assert ((caller.file, caller.name), (callee.file, callee.name)) in calls[rank], \
                (caller.name, callee.name, rank)


# Functions of the model's forward that issue no torch op (sample_runs' source): a dropout of
# 0 returns its input, f's forward is the identity, a group's size is a number.
OP_FREE = {"_dropout", "_CopyToTensorParallelRegion.forward", "Group.size"}


def test_every_function_of_the_models_forward_is_drawn_on_the_ranks_that_ran_it(
        callgraph_run, merged):
    """Each own function the profiling hook saw called below GPTChunk.forward on a rank is a
    node below it for that rank, but for the op-free ones, and no other is."""
    (chunk,) = merged.functions("GPTChunk.forward")
    below = [merged.node(n) for n in nx.descendants(merged.graph, chunk.id)] + [chunk]
    for rank, edges in read_calls(callgraph_run / "traces").items():
        callees = defaultdict(set)
        for caller, callee in edges:
            callees[caller].add(callee)
        ran, todo = set(), [(chunk.file, chunk.name)]
        while todo:
            fn = todo.pop()
            if fn not in ran:
                ran.add(fn)
                todo += callees[fn]
        drawn = {(n.file, n.name) for n in below if n.type == FUNCTION and rank in n.ranks}
        assert drawn == {fn for fn in ran if fn[1] not in OP_FREE}, rank


def test_every_collective_is_a_visible_leaf_in_the_oracles_number(rows, merged):
    """Per kind and phase, the collective leaves hold the trace's collectives, and as many as
    docs/oracles.md says: per micro-batch, each stage's layer issues 2 all-reduces forward
    (g) and 2 backward (f), the embedding 1 forward, the vocab-parallel loss 3 forward and the
    LM head 1 backward; the tied embedding's gradient is all-reduced once per rank (grad_sync);
    one activation goes forward and one gradient back per micro-batch and boundary. All of
    them stay drawn in the pruned graph."""
    recorded = Counter((r["kind"], r["phase"]) for _, _, r in rows if r["kind"])
    leaves = Counter()
    for leaf in merged.nodes(COMM):
        leaves[(leaf.kind, leaf.direction)] += leaf.total.comms
    m, layer = MICROBATCHES, LAYERS // 2           # one layer a stage
    tp = len(STAGES[0])
    oracle = {("all_reduce", "forward"): tp * m * ((2 * layer + 1) + (2 * layer + 3)),
              ("all_reduce", "backward"): tp * m * (2 * layer + (2 * layer + 1)),
              ("all_reduce", "grad_sync"): 2 * tp,
              ("send", "forward"): tp * m, ("recv", "forward"): tp * m,
              ("send", "backward"): tp * m, ("recv", "backward"): tp * m}
    assert dict(leaves) == dict(recorded) == oracle
    pruned = prune(merged, measures=("ops", "bytes"))
    assert sum(n.total.comms for n in pruned.nodes(COMM)) == sum(oracle.values())


def test_pruning_hides_nothing_without_saying_so(merged):
    """In the pruned graph each function's ops are those of its drawn callees, leaves and
    'hidden' note; the leaves drawn and the ops hidden add up to every event; the title counts
    the functions and sites it left out."""
    pruned = prune(merged, measures=("ops", "bytes"))
    g = pruned.graph
    assert pruned.nodes(HIDDEN)
    for node in pruned.nodes(FUNCTION):
        if g.out_degree(node.id):
            assert sum(pruned.edge(node.id, c).total.ops for c in g.successors(node.id)) == \
                node.total.ops, node.name
    for note in pruned.nodes(HIDDEN):
        (parent,) = g.predecessors(note.id)
        lost = [c for c in merged.graph.successors(parent) if c not in g]
        assert note.hidden == len(lost) > 0
        assert note.total.ops == sum(merged.edge(parent, c).total.ops for c in lost)
    leaves = [n for n in pruned.nodes() if n.type not in (FUNCTION, HIDDEN)]
    assert sum(n.total.ops for n in leaves) + pruned.hidden.ops == merged.total.ops
    functions = len(merged.nodes(FUNCTION))
    assert pruned.hidden.functions == functions - len(pruned.nodes(FUNCTION)) > 0
    assert pruned.hidden.sites == merged.graph.number_of_nodes() - functions - len(leaves) > 0
    dot = to_dot(pruned, title="t", paths={}, href=lambda f, l: None)
    assert f"hidden for readability: {pruned.hidden.functions} functions, " \
           f"{pruned.hidden.sites} op sites ({100 * pruned.hidden.ops / merged.total.ops:.0f}%" \
           " of ops" in dot


def test_every_node_links_to_the_source_line_it_names(rows, merged):
    """A function's link is the line of its ``def`` (line 1 for a module's code, a line of the
    comprehension for one), an op leaf's the line that issued its events, a note's its
    parent's; the rendered picture has them all, and its legend."""
    pruned = prune(merged, measures=("ops", "bytes"))
    files = {n.file for n in merged.nodes() if n.file}
    dot = to_dot(pruned, title="tp2 x pp2 all ranks", paths=display_paths(files),
                 href=lambda f, l: f"{f}#L{l}")
    links = re.findall(r'^\tn\d+ \[.*?URL="([^"]+)"', dot, re.M)
    assert len(links) == len(re.findall(r"^\tn\d+ \[", dot, re.M)) == \
        pruned.graph.number_of_nodes()
    issued = {(file, line) for _, path, _ in rows for file, _, line in path[-1:]}
    expected = Counter()
    for node in pruned.nodes():
        target = node
        if node.type == HIDDEN:
            target = pruned.node(next(iter(pruned.graph.predecessors(node.id))))
        expected[f"{target.file}#L{target.line}"] += 1
        text = Path(target.file).read_text().splitlines()[target.line - 1]
        if target.type == FUNCTION:
            assert _defines(text, target.name, target.line), (target.name, target.line, text)
        else:
            assert (target.file, target.line) in issued, (target.name, target.line)
            assert text.strip() and not text.strip().startswith("#"), (target.line, text)
    assert Counter(links) == expected
    svg = render_svg(dot)
    # + the legend's sample nodes
    assert svg.count('class="node"') == pruned.graph.number_of_nodes() + 6
    assert "#1565c0" in svg and "legend" in svg and "<title>" in svg


def _defines(text: str, qualname: str, line: int) -> bool:
    """Whether source line ``text`` (number ``line``) starts the function ``qualname``."""
    name = qualname.rsplit(".", 1)[-1]
    if name == "<module>":
        return line == 1
    if name in ("<listcomp>", "<dictcomp>", "<setcomp>", "<genexpr>"):
        return " for " in text
    return re.match(rf"\s*(async\s+)?def\s+{re.escape(name)}\(", text) is not None


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
    # FlopCounterMode has no entry for the CPU flash kernel: compare with its formulas. Grouped
    # query attention (fewer key/value heads) costs what it costs with each key/value head
    # repeated for its group of query heads; torch's formulas take such shapes only from 2.13
    # (2.10 and 2.11 assert equal heads), so they are given the repeated shapes.
    grad = q[:3] + v[3:]
    k_full, v_full = (q[0], q[1]) + k[2:], (q[0], q[1]) + v[2:]
    assert flops("aten._scaled_dot_product_flash_attention_for_cpu.default", text(q, k, v)) \
        == flop_counter.sdpa_flop_count(q, k_full, v_full)
    logsumexp = q[:3]
    assert flops("aten._scaled_dot_product_flash_attention_for_cpu_backward.default",
                 text(grad, q, k, v, grad, logsumexp)) \
        == flop_counter.sdpa_backward_flop_count(grad, q, k_full, v_full)


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
