"""trace-diff between DDP and FSDP2 of the same model (tests/scripts/tiny_gpt_train.py, 2 ranks,
gloo, --memory), each run from a script of its own (two copies: ``ddp_train.py`` and
``fsdp2_train.py``; the session's ``wrapped_runs``), as a new user compares them: modules
matched through the wrappers, every communication kind that changed named, the cost per step,
one step range, the call graph matched across the two scripts. Expected numbers come from the model itself (its parameters,
counted by torch) and FSDP2's and DDP's rules, never from the diff."""
from __future__ import annotations

import importlib.util
import json
import re

import pytest

from support import cli
from support.wrapped_runs import RANKS, SCRIPT, STEPS
from viz import diff
from viz.analysis import analyse
from viz.analysis.callgraphs.module_tree import NO_MODULE
from viz.diff.diffgraph import ADDED, CHANGED, REMOVED, UNCHANGED
from viz.run import open_run

COMPARED = tuple(range(1, STEPS))      # 0 is setup, the last is not closed
MODEL_ROOT = "(model)"     # the unwrapped model's root, as the diff names it
MATH = re.compile(r"aten\.(addmm|mm|gelu|native_layer_norm|embedding|_scaled_dot_product)")


def tiny_gpt():
    """The script's model module, imported (it runs nothing when imported)."""
    spec = importlib.util.spec_from_file_location("tiny_gpt_train", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def runs(wrapped_runs):
    return wrapped_runs["ddp"], wrapped_runs["fsdp2"]


@pytest.fixture(scope="module")
def result(runs):
    return diff.diff_runs(open_run(runs[0]), open_run(runs[1]))


def test_modules_match_through_ddp_and_fsdp2(result):
    assert (result.a.wrappers, result.b.wrappers) == (("DDP",), ("FSDP2",))
    bare = {name or MODEL_ROOT for name, _ in tiny_gpt().TinyGPT().named_modules()}
    ops = result.totals
    modules = {key[0] for key in set(ops.a.ops) | set(ops.b.ops)}
    assert modules <= bare | {NO_MODULE} and {"blocks.0.mlp.fc1", "head"} <= modules
    # the model's own math is the same in both: no key of it differs
    math = {key for key in ops.a.ops if MATH.match(key[1])}
    assert len(math) > 10 and math <= set(ops.b.ops)
    assert not [key for key, _, _ in ops.ops if MATH.match(key[1])]
    assert all(ops.a.ops[key] == ops.b.ops[key] for key in math)


def test_every_communication_kind_that_changed_is_named(result):
    changed = {key[0] for key, ca, cb, ba, bb in result.totals.comm}
    assert {"all_gather", "reduce_scatter", "all_reduce"} <= changed
    words = " ".join(result.in_words)
    for kind in changed:
        assert kind.replace("_", "-") in words, (kind, result.in_words)
        assert kind.replace("_", "-") in result.verdict()
    # FSDP2: an all-gather per fully_shard group forward (2 blocks + the root), again for
    # the blocks in backward (the root keeps its parameters), a reduce-scatter per group;
    # DDP: one bucket, one all-reduce a step
    per = len(COMPARED) * RANKS
    comm = {(k, phase): (result.totals.a.comm[(k, phase, g)], result.totals.b.comm[(k, phase, g)])
            for k, phase, g in set(result.totals.a.comm) | set(result.totals.b.comm)}
    assert comm[("all_gather", "forward")] == (0, 3 * per)
    assert comm[("all_gather", "backward")] == (0, 2 * per)
    assert comm[("reduce_scatter", "grad_sync")] == (0, 3 * per)
    assert comm[("all_reduce", "grad_sync")] == (per, 0)


def test_one_step_range_for_every_figure(runs, result):
    assert result.compared_steps == COMPARED
    for scope in [result.totals] + result.roles:
        for side in (scope.a, scope.b):
            # the communication rows and the dimension rows count the same calls
            assert sum(side.comm.values()) == sum(side.dim_calls.values()) > 0
            assert side.time_steps == len(COMPARED)
    analysis = analyse(open_run(runs[0]))
    walls = [sum(s.wall_s for s in m.steps if s.step in COMPARED)
             for m in analysis.metrics.values()]
    cost_a, _ = result.cost
    assert cost_a.step_s == pytest.approx(sum(walls) / len(walls) / len(COMPARED))


def test_cost_line_with_memory_by_category(runs, tmp_path, result):
    model = tiny_gpt().TinyGPT()
    params = sum(p.numel() for p in model.parameters())
    tensors = len(list(model.parameters()))
    a, b = result.cost
    # AdamW: two moments of each parameter (FSDP2: of its half) and a 4-byte step per tensor
    assert a.memory.by_category["optimizer_state"] == 2 * 4 * params + 4 * tensors
    assert b.memory.by_category["optimizer_state"] == 4 * params + 4 * tensors
    proc = cli.run("trace-diff", *runs, "--out", tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert "module paths matched through wrappers: A DDP, B FSDP2" in lines
    at = lines.index("Cost per step, A -> B (mean over ranks; memory: the largest rank's peak):")
    # one step range, said once (the cost lines say "step" for the step's time)
    assert [line for line in lines[:at + 1] + lines[at + 3:]
            if re.search(r"\bsteps? \d", line)] == [
        "Compared over steps 1-2 of both runs (step 0, the setup, left out: docs/metrics.md): "
        "every count, time and memory figure below."]
    assert re.match(r"  step \S+ \S+ -> \S+ \S+ \([+-]\d+%\) · compute .* · exposed comm .* · "
                    r"exposed comm, world ", lines[at + 1]), lines[at + 1]
    assert re.match(r"  memory peak \S+ \S+ -> \S+ \S+ .*: parameters .*, optimizer_state "
                    r"\S+ KiB -> \S+ KiB", lines[at + 2]), lines[at + 2]
    data = json.loads((tmp_path / "diff.json").read_text())
    assert data["cost"]["a"]["memory"]["by_category"]["optimizer_state"] == \
        a.memory.by_category["optimizer_state"]
    assert (data["a"]["wrappers"], data["b"]["wrappers"]) == (["DDP"], ["FSDP2"])
    html = (tmp_path / "diff.html").read_text()
    assert "Compared over steps 1-2 of both runs" in html and "optimizer_state" in html


def test_call_graph_matches_functions_across_the_two_scripts(result):
    (match,) = result.matched_files
    assert (match.a, match.b) == ("ddp_train.py", "fsdp2_train.py") and match.shared >= 5
    graph = result.graphs[0]
    counts = graph.counts()
    assert counts[CHANGED] + counts[UNCHANGED] > counts[ADDED] + counts[REMOVED]
    for name in ("<module>", "main", "TinyGPT.forward", "Block.forward", "MLP.forward"):
        assert graph.node(f"ddp_train.py:{name}").status in (CHANGED, UNCHANGED), name
    assert graph.node("ddp_train.py:MLP.forward").status == UNCHANGED
