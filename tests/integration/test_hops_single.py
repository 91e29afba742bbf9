"""Eager higher-order operators under the recorder, traced as one plain process: the real
``trace-run --no-launcher`` on tests/scripts/hops_single.py (torch.cond in a module with its
backward, while_loop, map, scan, invoke_subgraph, flex_attention without compile,
tag_activation_checkpoint): no torchrun environment reaches the script, every HOP runs (the
recorder used to crash them), and the ops each runs are recorded inside a range named after it
with the module and the user's line that called it. A HOP the recorder cannot look into runs
untouched, with one note in the trace's metadata (in-process, as torch's HOP dispatch calls the
mode)."""
from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest

import tracer
from support.gpt_helpers import env
from support.paths import REPO

SCRIPT = REPO / "tests" / "scripts" / "hops_single.py"


def marked_line(marker: str) -> int:
    lines = SCRIPT.read_text().splitlines()
    return next(i + 1 for i, text in enumerate(lines) if marker in text)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("hops")
    seen = out / "seen.json"
    environment = {k: v for k, v in env().items()
                   if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    proc = subprocess.run([sys.executable, "-m", "instrument.launch", "--no-launcher", "--out",
                           str(out / "run"), str(SCRIPT), str(seen)], cwd=REPO,
                          env=environment, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    trace = tracer.load(out / "run" / "traces" / "rank-0.arrow")
    return {"proc": proc, "out": out / "run", "seen": json.loads(seen.read_text()),
            "trace": trace, "records": trace.records()}


def section(records, label):
    return [e for e in records if e["annotation"] and e["annotation"][0]["label"] == label]


def hop_ranges(records, name):
    return [e for e in records if e["op"] == "paratrace::annotation"
            and e["annotation"][-1]["label"] == f"higher_order.{name}"]


def inside(records, name):
    """Ops (not ranges) inside a range of HOP ``name``."""
    return [e for e in records if e["op"] != "paratrace::annotation"
            and any(a["label"] == f"higher_order.{name}" for a in e["annotation"])]


def test_one_process_as_python_runs_it_with_the_same_report(run):
    # no launcher: the script sees none of torchrun's variables and takes its own path
    assert run["seen"]["env"] == dict.fromkeys(run["seen"]["env"])
    assert run["seen"]["distributed"] is False
    assert run["seen"]["argv0"] == str(SCRIPT)              # as given, as python sets it
    assert run["proc"].stdout.strip().splitlines()[-1] == str(run["out"] / "index.html")
    assert "in one process, without a launcher" in run["proc"].stderr
    record = json.loads((run["out"] / "run.json").read_text())
    assert record["world_size"] == 1 and record["exit_code"] == 0
    assert record["ranks"]["0"]["status"] == "ok"
    summary = json.loads((run["out"] / "summary.json").read_text())
    assert summary["world_size"] == 1 and summary["ranks"]["0"]["status"] == "ok"
    assert run["trace"].meta.get("untraced_hops") is None     # every HOP was looked into


def test_cond_in_a_module_records_its_branch_forward_and_backward(run):
    records = section(run["records"], "cond")
    forward, backward = hop_ranges(records, "cond")
    attrs = forward["annotation"][-1]
    assert attrs["source"] == "higher_order" and attrs["hop"] == "cond"
    assert (attrs["module"], forward["module"]) == ("Gate", "Gate")
    assert attrs["code"] == f"{SCRIPT}:{marked_line('COND CALL') - 1}"
    assert any(f[0] == str(SCRIPT) for f in forward["stack"])
    # the taken branch (self.a(t).sin()) ran inside the range, in the forward, in the module
    ops = [e for e in inside(records, "cond") if e["phase"] == "forward"]
    assert {"aten.sin.default"} <= {e["op"] for e in ops}
    assert {e["module"] for e in ops} == {"Gate"}
    # cond's backward is a HOP the engine runs: a second range, its ops backward
    assert backward["annotation"][-1].get("pass") == "backward"
    assert backward["annotation"][-1]["code"] == f"{SCRIPT}:{marked_line('BACKWARD LINE')}"
    back = [e for e in records if e["op"] != "paratrace::annotation" and e["t0"] >=
            backward["t0"] and e["t1"] is not None and e["t1"] <= backward["t1"]]
    assert back and {e["phase"] for e in back} == {"backward"}
    assert "aten.cos.default" in {e["op"] for e in back}          # d/dx sin(x)


def test_loops_record_each_iteration_inside_their_range(run):
    records, seen = run["records"], run["seen"]
    loops, rows = seen["loops"], seen["rows"]
    # while_loop: i < 3, body t * 2 and i + 1; the condition once more than the body
    ops = Counter(e["op"] for e in inside(section(records, "while_loop"), "while_loop"))
    assert ops["aten.mul.Tensor"] == loops and ops["aten.add.Tensor"] == loops
    assert ops["aten.lt.Scalar"] == loops + 1
    # map over 4 rows: row * 2 each; scan over 4 rows: carry + row and carry * 2 each
    assert Counter(e["op"] for e in inside(section(records, "map"), "map_impl")
                   )["aten.mul.Tensor"] == rows
    # (torch before 2.13 runs the combine once more on a copy of the first slice, for the
    # outputs' shapes, and may record that call's ops too: docs/compat.md)
    ops = Counter(e["op"] for e in inside(section(records, "scan"), "scan"))
    assert rows <= ops["aten.add.Tensor"] <= rows + 1
    assert rows <= ops["aten.mul.Tensor"] <= rows + 1
    ops = Counter(e["op"] for e in inside(section(records, "invoke_subgraph"),
                                          "invoke_subgraph"))
    assert ops["aten.mul.Tensor"] == 1
    for label, name in (("while_loop", "while_loop"), ("map", "map_impl"), ("scan", "scan"),
                        ("invoke_subgraph", "invoke_subgraph")):
        (hop,) = hop_ranges(section(records, label), name)
        assert hop["annotation"][-1]["code"].startswith(f"{SCRIPT}:"), label


def test_flex_attention_without_compile_records_its_dense_attention(run):
    records = section(run["records"], "flex_attention")
    (hop,) = hop_ranges(records, "flex_attention")
    assert hop["annotation"][-1]["code"].startswith(f"{SCRIPT}:")
    ops = Counter(e["op"] for e in inside(records, "flex_attention"))
    assert ops["aten.matmul.default"] == 2         # scores = q k^T, out = softmax(scores) v
    # the score_mod ran inside too (its where() on the scores)
    assert ops["aten.where.self"] >= 1


def test_tag_activation_checkpoint_gets_its_range_and_recomputes(run):
    records = section(run["records"], "tag_activation_checkpoint")
    (hop,) = hop_ranges(records, "tag_activation_checkpoint")
    assert hop["stack"][0][:2] == (str(SCRIPT), marked_line("tag_activation_checkpoint(graph"))
    phases = Counter((e["op"], e["phase"]) for e in records)
    assert phases[("aten.sin.default", "forward")] == 1
    # the recomputation this torch runs (the script's own counter, less the forward's sin and
    # cos's backward, -sin): one where the eager HOP checkpoints (torch >= 2.13), else none
    assert run["seen"]["checkpoint_sins"] in (2, 3)
    assert phases[("aten.sin.default", "recompute")] == run["seen"]["checkpoint_sins"] - 2


def test_a_hop_the_recorder_cannot_look_into_runs_untouched_with_one_note(tmp_path):
    import torch
    from torch._C import DispatchKey
    from torch._ops import HigherOrderOperator

    class Opaque(HigherOrderOperator):
        def __init__(self):
            super().__init__("paratrace_test_opaque")

        def __call__(self, x):
            return super().__call__(x)

    opaque = Opaque()
    opaque.py_impl(DispatchKey.Autograd)(lambda x: x * 3)    # no kernel below the mode
    x = torch.ones(2, requires_grad=True)
    with tracer.trace(tmp_path, clock_sync=False) as session:
        mode = session._mode
        # as torch's HOP dispatch calls a mode that supports HOPs: the mode off the stack
        with torch.utils._python_dispatch._pop_mode_temporarily():
            first = mode.__torch_dispatch__(opaque, [], (x,), {})
            second = mode.__torch_dispatch__(opaque, [], (x,), {})
    assert first.tolist() == second.tolist() == [3.0, 3.0]
    trace = tracer.load(tmp_path / "rank-0.arrow")
    assert list(trace.meta["untraced_hops"]) == ["paratrace_test_opaque"]
    ranges = hop_ranges(trace.records(), "paratrace_test_opaque")
    assert len(ranges) == 2 and all(r["annotation"][-1]["traced"] is False for r in ranges)
