"""Step windows: outside the recorded steps the recorder is not on the dispatch path at all (no
dispatch mode, no module hooks), and it comes back in its place on the mode stack."""
from __future__ import annotations

import os

import numpy as np

import torch
from torch.nn.modules import module as nn_module
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack

import tracer
from tracer.recorder.hotpath._mode import RecordingMode


def recorder_state() -> tuple:
    """(is paratrace's mode on this thread's dispatch stack, are global module hooks set)."""
    on_stack = any(isinstance(m, RecordingMode) for m in _get_current_dispatch_mode_stack())
    return on_stack, bool(nn_module._global_forward_pre_hooks)


def run_steps(n: int, seen: list) -> None:
    net = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    for _ in range(n):
        seen.append(recorder_state())
        net(torch.randn(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()


def test_outside_its_steps_the_recorder_is_off_the_dispatch_path(tmp_path):
    seen = []
    with tracer.trace(tmp_path, steps="1,3", clock_sync=False):
        run_steps(5, seen)
    assert seen == [(False, False), (True, True), (False, False), (True, True), (False, False)]
    assert recorder_state() == (False, False)                  # and gone after the trace
    trace = tracer.load(tmp_path / "rank-0.arrow")
    per_step = {}
    for e in trace.records():
        if "::" not in e["op"]:
            per_step[e["step"]] = per_step.get(e["step"], 0) + 1
    assert set(per_step) == {1, 3} and per_step[1] == per_step[3]
    assert trace.status == "ok" and trace.meta["last_step"] == 5


class Counting(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))


def test_a_mode_entered_outside_the_window_stays_above_the_recorder(tmp_path):
    """The recorder comes back under a mode the user entered while it was off, so that mode's
    own exit still pops that mode."""
    with tracer.trace(tmp_path, steps="1", clock_sync=False):
        counting = Counting()
        with counting:
            tracer.step()                                       # step 1: recorded
            stack = _get_current_dispatch_mode_stack()
            assert stack[-1] is counting and isinstance(stack[-2], RecordingMode)
            torch.ones(3).mul(2)
        assert isinstance(_get_current_dispatch_mode_stack()[-1], RecordingMode)
        tracer.step()                                           # step 2: off again
        assert recorder_state()[0] is False
    assert counting.ops >= 1
    muls = [e for e in tracer.load(tmp_path / "rank-0.arrow").records()
            if e["op"] == "aten.mul.Tensor"]
    assert [e["step"] for e in muls] == [1]


def test_nested_optimizer_steps_are_one_step_boundary(tmp_path):
    net = torch.nn.Linear(2, 2)
    inner = torch.optim.SGD(net.parameters(), lr=0.1)

    class Wrapper(torch.optim.SGD):
        def step(self, closure=None):
            return inner.step()                      # an optimizer that steps another one

    outer = Wrapper(net.parameters(), lr=0.1)
    with tracer.trace(tmp_path, clock_sync=False):
        for _ in range(2):
            net(torch.ones(1, 2)).sum().backward()
            outer.step()
    trace = tracer.load(tmp_path / "rank-0.arrow")
    assert trace.meta["last_step"] == 2
    assert [e["step"] for e in trace.records() if e["op"] == "paratrace::step"] == [1, 2]


def test_compiled_code_runs_and_dynamo_never_traces_the_recorder(tmp_path):
    from torch._dynamo.convert_frame import input_codes

    def f(x):
        return torch.sin(x) * 2

    compiled = torch.compile(f, backend="eager")
    x = torch.randn(8)
    with tracer.trace(tmp_path, clock_sync=False):
        y = compiled(x)
    assert torch.allclose(y, f(x))
    ops = [e["op"] for e in tracer.load(tmp_path / "rank-0.arrow").records()]
    assert "aten.sin.default" in ops and "aten.mul.Tensor" in ops
    tracer_dir = os.path.dirname(tracer.__file__) + os.sep
    traced = [ref() for ref in input_codes.seen]               # code objects Dynamo took on
    assert traced and not [c for c in traced if c and c.co_filename.startswith(tracer_dir)]


def test_ranges_open_across_a_window_edge_annotate_its_ops_and_are_not_encoded_outside(tmp_path):
    """Ranges are kept outside the window (one may enclose recorded steps) but not encoded
    there: the annotation dictionary holds only what recorded ops and ranges carried."""
    net = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    x = torch.randn(2, 4)
    with tracer.trace(tmp_path, steps="2", clock_sync=False):
        with tracer.annotate("run"):
            for step in range(4):
                if step == 1:
                    spanning = tracer.annotate("spanning")
                    spanning.__enter__()           # opened in step 1, closed in step 2
                with tracer.annotate(f"only-{step}", phase="forward"):
                    net(x).sum()
                if step == 2:
                    spanning.__exit__(None, None, None)
                    net(x).sum()                   # after it closed: under "run" only
                net(x).sum().backward()
                opt.step()
                opt.zero_grad()
    trace = tracer.load(tmp_path / "rank-0.arrow")
    labels = {tuple(r["label"] for r in trace.annotation(code))
              for code in np.unique(trace.col("annotation")) if code >= 0}
    # step 2 starts at step 1's optimizer step: step 1's zero_grad is recorded, under
    # "spanning"; step 2's optimizer step ends it, its own record_function range recorded
    assert labels == {("run",), ("run", "spanning"), ("run", "spanning", "only-2"),
                      ("run", "spanning", "Optimizer.zero_grad#SGD.zero_grad"),
                      ("run", "Optimizer.step#SGD.step")}
    encoded = " ".join(trace.dictionary("annotation"))
    assert "only-2" in encoded and not any(f"only-{s}" in encoded for s in (0, 1, 3))
    steps = set(trace.col("step")[trace.col("annotation") >= 0].tolist())
    assert steps == {2}
