"""torch.compile under the tracer: compiled code runs compiled (Dynamo compiles while recording;
inductor's extern kernels appear instead of the eager ops), each compiled graph call is a range,
a functional collective inside the compiled graph is recorded, compiled="eager" records the
program op by op and says so, and no warning about global module hooks. One 2-rank gloo launch
(tests/scripts/phases_compile.py). docs/phases.md#torchcompile."""
from __future__ import annotations

import json
from collections import Counter

import pytest

import tracer
from support.gpt_helpers import torchrun
from support.paths import SCRIPTS


QUALNAME = "Net.forward"          # on Python 3.10 too (tracer.recorder.attribution.qualnames)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("compile")
    torchrun("phases_compile.py", out)
    return {r: {"compiled": tracer.load(out / "compiled" / f"rank-{r}.arrow"),
                "eager": tracer.load(out / "eager" / f"rank-{r}.arrow"),
                "counters": json.loads((out / f"counters-{r}.json").read_text()),
                "warnings": json.loads((out / f"warnings-{r}.json").read_text())}
            for r in range(2)}


def section(records, label, iteration=None):
    """Records of one annotated part; ``iteration``: of one training iteration (1: the second,
    warm: compiled already)."""
    return [e for e in records if e["annotation"] and e["annotation"][0]["label"] == label
            and (iteration is None or e["annotation"][0]["iteration"] == iteration)]


def region(e, which=None):
    found = next((a for a in e["annotation"] if a.get("source") == "torch.compile"), None)
    return found if which is None or (found and found["pass"] == which) else None


def test_inductor_code_runs_compiled_while_recording(run):
    for r in run.values():
        counts = r["counters"]
        # Dynamo compiled one graph for the inductor model and one for the eager-backend one
        # while the trace recorded; with compiled="eager" it compiled none (it skipped)
        assert counts["inductor"]["graphs"] - counts["start"]["graphs"] == 1
        assert counts["inductor"]["extern_calls"] > counts["start"]["extern_calls"]
        assert counts["eager-backend"]["graphs"] - counts["inductor"]["graphs"] == 1
        assert counts["traced-eagerly"] == counts["eager-backend"]
        ops = Counter(e["op"] for e in section(r["compiled"].records(), "inductor", 1))
        eager_backend = Counter(e["op"] for e in section(r["compiled"].records(),
                                                         "eager-backend", 1))
        # inductor: extern matmuls, relu/pow fused away; Dynamo's eager backend: eager ops
        assert ops["aten.addmm.out"] == 2 and ops["aten.mm.out"] == 3
        assert ops["aten.relu.default"] == 0 and ops["aten.addmm.default"] == 0
        assert eager_backend["aten.addmm.default"] == 2 and eager_backend["aten.relu.default"] == 1


def test_compiled_graph_calls_are_ranges_with_their_code_and_module(run):
    for r in run.values():
        records = section(r["compiled"].records(), "inductor", 1)
        ranges = [e for e in records if e["op"] == "paratrace::annotation" and region(e)
                  and e["annotation"][-1].get("source") == "torch.compile"]
        assert [region(e)["pass"] for e in ranges] == ["forward", "backward"]
        attrs = region(ranges[0])
        script = SCRIPTS / "phases_compile.py"
        line = next(i + 1 for i, text in enumerate(script.read_text().splitlines())
                    if "def forward" in text)
        assert attrs["code"] == f"{script}:{line}"
        # the code's qualified name (Python 3.11 on), else its name
        assert attrs["fn"] == QUALNAME and attrs["module"] == "Net"
        assert "inductor" in attrs["backend"]
        inside = [e for e in records if e["op"].startswith("aten.") and region(e)]
        assert {(e["phase"], region(e)["pass"]) for e in inside} == \
            {("forward", "forward"), ("backward", "backward")}
        assert {e["op"] for e in inside if region(e, "backward")} >= {"aten.mm.out"}
        assert all(e["module"] == "Net" for e in inside)


def test_a_collective_inside_the_compiled_graph_is_recorded(run):
    for r in run.values():
        for label in ("inductor", "eager-backend"):
            records = section(r["compiled"].records(), label, 1)
            (reduce,) = [e for e in records if e["kind"]]
            assert reduce["kind"] == "all_reduce" and region(reduce, "forward")
            assert reduce["phase"] == "forward" and reduce["group"] == (0, 1)
            assert reduce["bytes"] == 4 and reduce["t1"] is not None
            waits = [e for e in records if e["op"] == "_c10d_functional.wait_tensor.default"]
            assert [w["cid"] for w in waits] == [reduce["cid"]]


def test_compiled_eager_records_every_op_and_says_so(run):
    for r in run.values():
        assert r["compiled"].meta["options"]["compiled"] == "compiled"
        assert r["eager"].meta["options"]["compiled"] == "eager"
        records = section(r["eager"].records(), "inductor", 1)
        assert not [e for e in records if region(e)]
        addmm = [e["module"] for e in records if e["op"] == "aten.addmm.default"]
        assert addmm == ["Net.a", "Net.b"]       # eager: every module and op, as untraced eager
        assert Counter(e["op"] for e in records)["aten.relu.default"] == 1


def test_no_warning_about_global_module_hooks(run):
    for r in run.values():
        assert not [w for w in r["warnings"] if "hook" in w], r["warnings"]
