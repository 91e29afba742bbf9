"""Code torch.fx runs records the traced model's own source lines
(tracer/recorder/attribution/fxframes.py): a GraphModule's generated forward and
torch.fx.Interpreter's nodes are replaced by the frames their graph nodes recorded. One model run
eagerly and three FX ways in one process (tests/scripts/fx_stacks.py), under either hot path, must
record the eager run's stacks; and torch.distributed.pipelining's pipeline() on 2 ranks
(tests/scripts/pipeline_stacks.py) must record the model's forward lines, found here with
inspect."""
from __future__ import annotations

import gc
import importlib.util
import inspect
import json
import os
import subprocess
import sys
import tracemalloc
from collections import Counter

import pytest
import torch

import tracer
from support.gpt_helpers import torchrun
from tracer.recorder.attribution.fxframes import FxFrames
from tracer.recorder.attribution.stacks import PyStackInterner, StackInterner
from support.paths import SCRIPTS

FX_WAYS = ("generated", "interpreted", "interpreted-as-generated")


def load_script(name: str):
    """A test script as a module (its __main__ block does not run)."""
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def line_in(fn, text: str) -> tuple:
    """(file, line, qualname) of the only line of ``fn``'s source holding ``text``; the
    qualname, as a frame records it on every Python."""
    lines, first = inspect.getsourcelines(fn)
    hits = [first + i for i, line in enumerate(lines) if text in line]
    assert len(hits) == 1, (fn, text, hits)
    return (inspect.getsourcefile(fn), hits[0], fn.__qualname__)


TORCH_DIR = os.path.dirname(torch.__file__) + os.sep


def frames(stack) -> list:
    return [(f[0], f[1], f[3]) for f in stack or ()]


def user_frames(stack) -> list:
    """The frames of a stack outside torch."""
    return [f for f in frames(stack) if not f[0].startswith(TORCH_DIR)]


def exports_record_torch_frames() -> bool:
    """Whether this torch's export records torch's own frames in its nodes' stack traces
    (torch 2.13 does: Linear.forward; 2.6 does not), asked of torch itself."""
    script = load_script("fx_stacks")
    exported = torch.export.export(script.Model(), (torch.randn(4, 8),))
    return any(TORCH_DIR in (node.meta.get("stack_trace") or "")
               for node in exported.graph.nodes)


@pytest.fixture(scope="module")
def fx_runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("fx")
    runs = {}
    for name, pure in (("c", ""), ("python", "1")):
        env = {**os.environ, "PARATRACE_PURE_PYTHON": pure, "OMP_NUM_THREADS": "1"}
        subprocess.run([sys.executable, str(SCRIPTS / "fx_stacks.py"), str(out / name)],
                       env=env, check=True, timeout=300, capture_output=True)
        trace = tracer.load(out / name / "rank-0.arrow")
        runs[name] = (trace.meta["hot_path"],
                      [{k: v for k, v in r.items() if k not in ("t0", "t1", "t_ret")}
                       for r in trace.records()])
    return runs


def by_way(records) -> dict:
    out: dict = {}
    for e in records:
        if e["annotation"] and e["op"] != "paratrace::annotation":
            out.setdefault(e["annotation"][0]["label"], []).append(e)
    return out


def test_either_hot_path_records_the_same_fx_stacks(fx_runs):
    built = importlib.util.find_spec("tracer.recorder._hotpath") is not None
    assert fx_runs["c"][0] == ("c" if built else "python")
    assert fx_runs["python"][0] == "python"
    assert len(fx_runs["c"][1]) > 300
    assert fx_runs["c"][1] == fx_runs["python"][1]


def test_fx_code_records_the_stacks_the_model_records_eagerly(fx_runs):
    ways = by_way(fx_runs["c"][1])
    assert set(FX_WAYS) <= set(ways)
    # torch's frames (Linear.forward, where the model called torch) only where torch recorded
    # them when it traced the model
    kept = frames if exports_record_torch_frames() else user_frames

    def profile(events):
        return Counter((e["op"], e["phase"], tuple(kept(e["stack"])),
                        tuple(kept(e["fwd_stack"]))) for e in events)
    eager = profile(ways["eager"])
    for way in FX_WAYS:
        assert profile(ways[way]) == eager, way


def test_fx_code_records_the_models_forward_lines(fx_runs):
    script = load_script("fx_stacks")
    fc1 = line_in(script.Block.forward, "self.fc1(x)")
    fc2 = line_in(script.Block.forward, "self.fc2(h)")
    loop = line_in(script.Model.forward, "x = block(x)")
    ways = by_way(fx_runs["c"][1])
    for way in FX_WAYS:
        addmm = [e for e in ways[way] if e["op"] == "aten.addmm.default"]
        # 2 blocks x 2 Linear layers, run twice
        assert len(addmm) == 8
        assert Counter(tuple(user_frames(e["stack"])[:2]) for e in addmm) == {
            (fc1, loop): 4, (fc2, loop): 4}
        relu = [e for e in ways[way] if e["op"] == "aten.relu.default"]
        assert len(relu) == 4 and {tuple(frames(e["stack"])[:2]) for e in relu} == {(fc1, loop)}
        # the backward's matrix products were made by those forward lines
        mm = [e for e in ways[way] if e["op"] == "aten.mm.default"]
        assert mm and {tuple(user_frames(e["fwd_stack"])[:2]) for e in mm} == {
            (fc1, loop), (fc2, loop)}


def test_a_recorded_frame_gets_the_qualified_name_of_its_function():
    fx = FxFrames()
    script = load_script("fx_stacks")
    file, line, qualname = line_in(script.Block.forward, "self.fc2(h)")
    assert fx.qualname(file, line, "forward") == qualname == "Block.forward"
    assert fx.qualname(file, line, "elsewhere") == "elsewhere"     # no such function there
    assert fx.qualname("/no/such/file.py", 3, "forward") == "forward"


# ---------------------------------------------------------------- the walk, C and Python
PAIR: list = []          # the interners the probe captures with
CAPTURED: list = []      # per probe call: (C id, Python id, C text, Python text)


def probe(x):
    """A function the graph calls: both interners capture its stack."""
    frame = sys._getframe(0)
    ids = [interner.capture(frame) for interner in PAIR]
    CAPTURED.append((*ids, *(i.values[n] for i, n in zip(PAIR, ids))))
    return x + 1


torch.fx.wrap("probe")


class Probed(torch.nn.Module):
    def forward(self, x):
        y = probe(x)                 # PROBE ONE
        return probe(y)              # PROBE TWO


def probed_graph():
    """Probed traced by fx.Tracer with its stack traces: (GraphModule, its nodes)."""
    fx_tracer = torch.fx.Tracer()
    fx_tracer.record_stack_traces = True
    graph = fx_tracer.trace(Probed())
    return torch.fx.GraphModule(Probed(), graph), list(graph.nodes)


def test_c_and_python_walks_agree_on_fx_frames_and_key_interpreted_ones_by_node():
    PAIR[:] = [StackInterner(), PyStackInterner()]
    CAPTURED.clear()
    gm, _ = probed_graph()
    x = torch.ones(2)
    for _ in range(3):
        gm(x)                                        # generated code
        torch.fx.Interpreter(gm).run(x)              # one code runs both probe nodes
    assert len(CAPTURED) == 12
    assert all(c == py and c_text == py_text for c, py, c_text, py_text in CAPTURED)
    one = line_in(Probed.forward, "PROBE ONE")
    two = line_in(Probed.forward, "PROBE TWO")
    body = line_in(probe, "interner.capture(frame)")
    # each probe call: the probe, then the graph's line that called it (not FX's frames)
    stacks = [tuple(frames(json.loads(text))[:2]) for _, _, text, _ in CAPTURED]
    assert stacks == [(body, one), (body, two)] * 6
    for interner in PAIR:
        interner.release()


def test_fx_frames_hold_no_reference_they_do_not_release():
    PAIR[:] = [StackInterner()]
    gm, nodes = probed_graph()
    x = torch.ones(2)

    def runs(count):
        for _ in range(count):
            torch.fx.Interpreter(gm).run(x)
            gm(x)
    used, refs = [], None
    tracemalloc.start()
    try:
        for count in (10, 200, 800):
            runs(count)              # from one call site: the same stacks every time
            CAPTURED.clear()
            gc.collect()             # an Interpreter holds itself in cycles
            used.append(tracemalloc.get_traced_memory()[0])
            refs = refs or [sys.getrefcount(node) for node in nodes]
    finally:
        tracemalloc.stop()
    # 3,200 more captures: a leak of one small object each (16 B or more) is over 50 KB. A
    # table of live frames that churns resizes now and then, in steps of about 5 KB (seen on
    # Python 3.10, with no container growing), so the bound leaves room for a few.
    assert used[2] - used[1] < 16384
    assert [sys.getrefcount(node) for node in nodes] == refs
    PAIR[0].release()


@pytest.fixture(scope="module")
def pipeline_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("pipeline")
    torchrun("pipeline_stacks.py", out)
    return {r: tracer.load(out / f"rank-{r}.arrow").records() for r in range(2)}


def test_pipeline_stages_record_the_models_forward_lines(pipeline_run):
    script = load_script("pipeline_stacks")
    fc1 = line_in(script.Block.forward, "self.fc1(x)")
    fc2 = line_in(script.Block.forward, "self.fc2(h)")
    loop = line_in(script.Model.forward, "x = block(x)")
    linear = line_in(torch.nn.Linear.forward, "F.linear(")
    per_stage = script.BLOCKS // 2
    torch_frames = exports_record_torch_frames()
    for rank, records in pipeline_run.items():
        step_line = line_in(script.main, f"STEP LINE {rank}")
        ops = [e for e in records if e["step"] == 1 and not e["kind"]]
        addmm = [e for e in ops if e["op"] == "aten.addmm.default"]
        # M micro-batches through the stage's blocks, two Linear layers each
        assert len(addmm) == script.M * per_stage * 2
        assert {e["phase"] for e in addmm} == {"forward"}
        # the model's lines down from the schedule's step() call
        assert Counter(tuple(user_frames(e["stack"])[:3]) for e in addmm) == {
            (fc1, loop, step_line): script.M * per_stage,
            (fc2, loop, step_line): script.M * per_stage}
        if torch_frames:      # and torch's Linear.forward, the call into torch
            assert {frames(e["stack"])[0] for e in addmm} == {linear}
        blocks = {f"GraphModule.blocks.{rank * per_stage + i}" for i in range(per_stage)}
        assert {e["module"].rsplit(".", 1)[0] for e in addmm} == blocks
        # the backward's matrix products point at the same lines
        mm = [e for e in ops if e["op"] == "aten.mm.default" and e["phase"] == "backward"]
        assert mm and {tuple(user_frames(e["fwd_stack"])[:2]) for e in mm} == {
            (fc1, loop), (fc2, loop)}
