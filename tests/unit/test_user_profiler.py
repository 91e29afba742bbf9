"""A user's torch.profiler under the recorder gives the profile it gives without it: any
TorchDispatchMode makes torch record each op twice, with a PythonDispatchMode range between
(pytorch#195746) and record_function ranges crossing it (pytorch#191797);
tracer/recorder/user_profile.py leaves the recording mode's events out. The expected profile is
torch's own, taken of the same steps without the recorder (and the script's own call count)."""
from __future__ import annotations

import collections
import contextlib
import json

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils._python_dispatch import TorchDispatchMode

import tracer
from tracer.recorder import compat
from tracer.recorder.user_profile import (MARK, PASSED, PYTHON_DISPATCH, Event,
                                          filter_chrome_trace, own_events)

MM_CALLS = 5     # the script's own torch.mm calls a step


class PassThrough(TorchDispatchMode):
    """A user's own mode: without the recorder too, its PythonDispatchMode ranges are there."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def _model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    return model, torch.optim.SGD(model.parameters(), lr=0.1), torch.randn(8, 16)


def _step(model, opt, x, own_mode: bool) -> None:
    a = torch.randn(8, 8)
    with record_function("user.step"):
        for _ in range(MM_CALLS):
            torch.mm(a, a)
        with PassThrough() if own_mode else contextlib.nullcontext():
            loss = model(x).to(torch.float64).sum()
        with record_function("user.backward"):
            loss.backward()
    opt.step()
    opt.zero_grad()


def _spans(path) -> list[dict]:
    events = json.load(open(path))["traceEvents"]
    return [e for e in events if e.get("ph") == "X" and e.get("cat") in ("cpu_op",
                                                                         "user_annotation")]


def _shape(spans: list[dict]) -> tuple[collections.Counter, int]:
    """(parent name, name) of every op and range, and how many ranges cross another."""
    pairs, crossing, stack = collections.Counter(), 0, []
    for e in sorted(spans, key=lambda e: (e["tid"], e["ts"], -e["dur"])):
        while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"]:
            stack.pop()
        if stack and stack[-1]["ts"] + stack[-1]["dur"] < e["ts"] + e["dur"]:
            crossing += 1
        pairs[(stack[-1]["name"] if stack else None, e["name"])] += 1
        stack.append(e)
    return pairs, crossing


def _profiled(path, own_mode: bool) -> dict:
    model, opt, x = _model()
    _step(model, opt, x, own_mode)            # warm: first calls allocate and import
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        _step(model, opt, x, own_mode)
    prof.export_chrome_trace(str(path))
    pairs, crossing = _shape(_spans(path))
    return {"counts": {k.key: k.count for k in prof.key_averages()},
            "tree": collections.Counter((e.cpu_parent.name if e.cpu_parent else None, e.name)
                                        for e in prof.events()),
            "trace": pairs, "crossing": crossing}


def _recorded_ops(out) -> collections.Counter:
    return collections.Counter(tracer.load(next(out.glob("rank-*.arrow"))).table
                               .column("op").to_pylist())


@pytest.mark.parametrize("own_mode", [False, True], ids=["alone", "under-a-users-mode"])
def test_a_users_profile_under_the_recorder_is_the_profile_without_it(tmp_path, own_mode):
    plain = _profiled(tmp_path / "plain.json", own_mode)
    with tracer.trace(tmp_path / "traced", clock_sync=False) as session:
        traced = _profiled(tmp_path / "traced.json", own_mode)
        mode = session._mode
        # the C path (where built) is the mode's dispatch again once the profiler stopped
        assert "_unmarked" not in vars(mode)
        assert type(vars(mode).get("__torch_dispatch__")).__name__ in ("OpDispatch", "NoneType")
    assert plain["counts"]["aten::mm"] >= MM_CALLS          # the script's calls, and backward's
    assert traced["counts"] == plain["counts"]               # key_averages()
    assert traced["tree"] == plain["tree"]                   # events(): each op's parent
    assert traced["trace"] == plain["trace"]                 # the exported trace
    assert traced["crossing"] == plain["crossing"]
    if not own_mode:
        assert plain["crossing"] == 0 and PYTHON_DISPATCH not in plain["counts"]
        assert plain["trace"][("user.step", "aten::mm")] == MM_CALLS


def test_dtensor_ops_keep_their_python_subclass_ranges(tmp_path):
    """DTensor ops on a world of one (gloo, in this process): the recorder hands each to
    DTensor's own dispatch by answering NotImplemented, inside torch's PythonDispatchMode
    range; without a mode torch records that dispatch as a PythonSubclass range."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        w = distribute_tensor(torch.randn(16, 16), mesh, [Shard(0)])
        x = distribute_tensor(torch.randn(4, 16), mesh, [Replicate()])

        def profiled(path) -> tuple:
            torch.mm(x, w.t()).relu().sum().full_tensor()          # warm
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                torch.mm(x, w.t()).relu().sum().full_tensor()
            prof.export_chrome_trace(str(path))
            return {k.key: k.count for k in prof.key_averages()}, _shape(_spans(path))[0]
        plain = profiled(tmp_path / "plain.json")
        with tracer.trace(tmp_path / "traced", clock_sync=False):
            traced = profiled(tmp_path / "traced.json")
    finally:
        dist.destroy_process_group()
    assert plain[0]["PythonSubclass"] == 4 and plain[1][("aten::mm", "PythonSubclass")] == 1
    assert traced == plain


def test_the_recording_is_the_same_with_and_without_a_users_profiler(tmp_path):
    for name, profiled in (("with", True), ("without", False)):
        model, opt, x = _model()
        with tracer.trace(tmp_path / name, clock_sync=False):
            _step(model, opt, x, False)
            with profile(activities=[ProfilerActivity.CPU]) if profiled else \
                    contextlib.nullcontext():
                _step(model, opt, x, False)
    assert _recorded_ops(tmp_path / "with") == _recorded_ops(tmp_path / "without")


def test_a_profile_without_the_recorder_is_left_as_torch_made_it(tmp_path):
    # the patch is out once the trace ended: nothing wraps torch's result
    with tracer.trace(tmp_path / "t", clock_sync=False):
        pass
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.mm(torch.ones(2, 2), torch.ones(2, 2))
    assert not isinstance(prof.profiler.kineto_results, compat.UserProfileResult)


def _ev(name, start, end, corr=0, linked=0, python=False, lane=(0, 0)):
    return Event(lane, start, end, name, python, corr, linked)


def test_the_modes_events_are_found_by_its_marks():
    # Y > P > mark > X > child, then a launch linked to X; a user's mode's P (no mark) beside it
    events = [_ev("aten::mm", 0, 100, corr=1), _ev(PYTHON_DISPATCH, 5, 95),
              _ev("mode.py(3): dispatch", 6, 94, python=True), _ev(MARK, 10, 90),
              _ev("aten::mm", 20, 80, corr=2), _ev("aten::resolve_conj", 30, 31, corr=3),
              _ev("cudaLaunchKernel", 40, 41, linked=2),
              _ev("aten::add", 200, 300, corr=4), _ev(PYTHON_DISPATCH, 205, 295),
              _ev("aten::add", 210, 290, corr=5)]
    own = own_events(events)
    assert own.dropped == {1, 2, 3, 4}
    assert own.relink == {2: 1}


def test_an_autograd_range_between_the_op_and_the_mode_is_kept():
    # aten::detach > detach (VariableType's own range) > P > mark > aten::detach
    events = [_ev("aten::detach", 0, 100, corr=1), _ev("detach", 2, 98, corr=2),
              _ev(PYTHON_DISPATCH, 4, 96), _ev(MARK, 5, 95), _ev("aten::detach", 10, 20, corr=3)]
    own = own_events(events)
    assert own.dropped == {2, 3, 4} and own.relink == {3: 1}


def test_a_detach_torch_dispatched_to_the_mode_itself_is_the_modes():
    # a shallow copy under a mode: torch hands aten::detach to the mode (no P around the mark)
    events = [_ev("aten::relu", 0, 100, corr=1), _ev(MARK, 50, 90),
              _ev("aten::detach", 55, 85, corr=2), _ev("detach", 60, 80, corr=3)]
    assert own_events(events).dropped == {1, 2, 3}


def test_a_range_that_crosses_the_mark_is_the_users():
    # record_function's enter dispatched through the mode: its range starts inside the mark
    events = [_ev(PYTHON_DISPATCH, 0, 10), _ev(MARK, 1, 9), _ev("user.step", 5, 500),
              _ev("aten::mm", 100, 200, corr=7)]
    assert own_events(events).dropped == {0, 1}


def test_a_subclass_the_mode_passed_on_keeps_its_range_under_its_name():
    # Y > P > mark (empty: NotImplemented) + passed > the subclass's local ops
    events = [_ev("aten::mm", 0, 100, corr=1), _ev(PYTHON_DISPATCH, 5, 95), _ev(MARK, 10, 12),
              _ev(PASSED, 13, 13.5), _ev("aten::mm", 20, 80, corr=2)]
    own = own_events(events)
    assert own.dropped == {2, 3} and own.renamed == {1: "PythonSubclass"} and own.relink == {}


def test_an_exported_trace_links_launches_to_the_op_the_user_called(tmp_path):
    """On CUDA a kernel's launch carries the External id of the op around it: the repeated op
    the mode made, left out; it is linked to the op the user called instead."""
    def x(name, ts, dur, cat="cpu_op", tid=1, **args):
        return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts,
                "dur": dur, "args": args}
    events = [x("aten::mm", 0, 100, **{"External id": 7}), x(PYTHON_DISPATCH, 5, 90),
              x(MARK, 10, 80), x("aten::mm", 20, 60, **{"External id": 8}),
              x("cudaLaunchKernel", 30, 5, cat="cuda_runtime", correlation=99,
                **{"External id": 8}),
              x("gemm", 200, 50, cat="kernel", tid=7, correlation=99, **{"External id": 8}),
              x("helper.py(3): f", 40, 1, cat="python_function")]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events, "schemaVersion": 1}))
    assert filter_chrome_trace(str(path)) == 3
    kept = json.loads(path.read_text())["traceEvents"]
    assert [(e["name"], e["args"].get("External id")) for e in kept] == [
        ("aten::mm", 7), ("cudaLaunchKernel", 7), ("gemm", 7), ("helper.py(3): f", None)]
    untouched = tmp_path / "u.json"
    untouched.write_text(json.dumps({"traceEvents": events[:1]}))
    before = untouched.read_bytes()
    assert filter_chrome_trace(str(untouched)) == 0 and untouched.read_bytes() == before
