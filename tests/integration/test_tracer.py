"""The recorder in one process: attribution of backward ops, steps, annotations, phases, the
status file, and a cut in the last batch (truncation, garbage, newer versions, a SIGKILL and a
million events: test_trace_file_faults.py)."""
from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys

import pyarrow as pa
import pytest
import torch

import tracer

HERE = os.path.abspath(__file__)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        return torch.relu(self.fc(x))            # FC_LINE


FC_LINE = next(i for i, line in enumerate(inspect.getsource(Net).splitlines())
               if "FC_LINE" in line) + inspect.getsourcelines(Net)[1]


def train(n_steps: int, out, **options):
    torch.manual_seed(0)
    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    with tracer.trace(out, **options):
        for i in range(n_steps):
            with tracer.annotate("F", microbatch=i):
                loss = net(torch.randn(2, 8)).sum()
            loss.backward()
            opt.step()
            opt.zero_grad()
    return tracer.load(os.path.join(out, "rank-0.arrow"))


def test_backward_matmul_is_attributed_to_the_forward_linear_line(tmp_path):
    trace = train(1, tmp_path)
    backward_mms = [e for e in trace.records()
                    if e["op"] == "aten.mm.default" and e["phase"] == "backward"]
    assert len(backward_mms) == 1                 # the weight gradient (the input needs none)
    for e in backward_mms:
        assert e["module"] == "Net.fc"
        user = [f for f in e["fwd_stack"] if f[0] == HERE]
        assert user[0][1] == FC_LINE and user[0][3] == "Net.forward"
        assert e["fwd_stack"][0][3] == "Linear.forward"      # the boundary call into torch
        # the live stack of a backward op only shows loss.backward()
        assert any(f[2] == "backward" for f in e["stack"])
    forward = [e for e in trace.records() if e["op"] == "aten.addmm.default"]
    assert forward and forward[0]["phase"] == "forward" and forward[0]["module"] == "Net.fc"
    assert forward[0]["shapes"] == "f32[4] f32[2,8] f32[8,4]"
    assert forward[0]["annotation"] == [{"label": "F", "microbatch": 0}]


def test_optimizer_steps_are_step_boundaries_and_windows_select_steps(tmp_path):
    full = train(4, tmp_path / "all")
    per_step = {s: sum(1 for e in full.records() if e["step"] == s and "::" not in e["op"])
                for s in range(4)}
    assert all(n > 0 for n in per_step.values()) and len(set(per_step.values())) == 1
    assert {e["phase"] for e in full.records() if "sgd" in str(e["annotation"]).lower()} \
        == {"optimizer"}
    window = train(4, tmp_path / "window", steps="1-2")
    assert {e["step"] for e in window.records()} == {1, 2}
    assert len([e for e in window.records() if "::" not in e["op"]]) == 2 * per_step[0]


def test_annotations_and_record_function_ranges_are_recorded(tmp_path):
    with tracer.trace(tmp_path):
        with tracer.annotate("outer", chunk=1):
            with torch.profiler.record_function("inner-rf"):
                torch.ones(3).sum()
        with tracer.annotate("W", microbatch=3):
            torch.zeros(2).add(1)
    trace = tracer.load(tmp_path / "rank-0.arrow")
    records = trace.records()
    total = next(e for e in records if e["op"] == "aten.sum.default")
    assert [a["label"] for a in total["annotation"]] == ["outer", "inner-rf"]
    assert total["annotation"][0]["chunk"] == 1
    ranges = [e for e in records if e["op"] == "paratrace::annotation"]
    assert [r["annotation"][-1]["label"] for r in ranges] == ["inner-rf", "outer", "W"]
    assert all(r["t1"] >= r["t0"] for r in ranges)
    add = next(e for e in records if e["op"] == "aten.add.Tensor")
    assert add["phase"] == "backward"                # W ranges are weight-gradient work


@pytest.mark.parametrize("label,phase", [
    ("F", 1), ("W", 2), ("optimizer", 5), ("Forward 3", 1), ("Backward 12", 2), ("PP:0F1", 1),
    ("PP:1I0", 2), ("PP:2SEND_B1", 2), ("PP:0RECV_F2", 1), ("PP:0UNSHARD1", None),
    ("Optimizer.step#SGD.step", 5), ("grad-sync", 4), ("recompute", 3),
    ("FSDP::post_backward_reduce (0)", 4), ("FSDP::pre_forward", None)])
def test_phase_of_annotation_labels_including_pipelinings(label, phase):
    from tracer.vocab.labels import phase_of_label
    assert phase_of_label(label) == phase


def test_annotate_step_and_record_config_are_free_without_a_trace():
    assert tracer.active() is None
    with tracer.annotate("F", microbatch=0):
        tracer.step()
        tracer.record_config(tp=2)


def test_config_and_status_reach_the_file(tmp_path):
    with tracer.trace(tmp_path):
        tracer.record_config(tp=2, schedule="1f1b")
        tracer.record_config(pp=2)
        torch.ones(1)
    trace = tracer.load(tmp_path / "rank-0.arrow")
    assert trace.config == {"tp": 2, "schedule": "1f1b", "pp": 2}
    assert trace.status == "ok" and trace.complete and not trace.warnings


def test_a_raising_block_is_recorded_as_failed(tmp_path):
    with pytest.raises(ValueError):
        with tracer.trace(tmp_path):
            torch.ones(1)
            raise ValueError("boom")
    trace = tracer.load(tmp_path / "rank-0.arrow")
    assert trace.status == "failed" and trace.meta["error"] == "ValueError: boom"


def test_a_directory_of_an_earlier_runs_trace_is_refused_in_one_line(tmp_path):
    """tracer.trace(DIR) never writes over an earlier run's trace, as trace-run refuses such an
    --out: not this process's own earlier trace, nor one a process before this one wrote."""
    out = tmp_path / "run"
    train(1, out)
    kept = (out / "rank-0.arrow").read_bytes()
    with pytest.raises(FileExistsError) as again:
        train(1, out)
    message = str(again.value)
    assert message == (f"tracer.trace: {out} already holds an earlier run's trace "
                       "(rank-0.arrow); give a new directory or remove the rank-<R> files of "
                       "the old run (trace-run refuses so too)")
    assert (out / "rank-0.arrow").read_bytes() == kept        # nothing written over
    hour_ago = os.stat(out / "rank-0.arrow").st_mtime - 3600  # a run an hour before this one
    os.utime(out / "rank-0.arrow", (hour_ago, hour_ago))
    later = subprocess.run(
        [sys.executable, "-c", "import sys, torch, tracer\n"
         "with tracer.trace(sys.argv[1]):\n    torch.ones(2) + 1", str(out)],
        capture_output=True, text=True, timeout=120)
    assert later.returncode == 1 and later.stderr.strip().splitlines()[-1].endswith(message)
    assert (out / "rank-0.arrow").read_bytes() == kept
    train(1, tmp_path / "new")                                # a new directory is fine


def test_bad_step_selection_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="bad step selection"):
        tracer.trace(tmp_path, steps="3-1")


class _IdentityF(torch.autograd.Function):
    """Megatron's f: identity forward (no aten op at all), work in backward."""

    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad * 1


def test_backward_of_a_function_with_no_forward_op_is_attributed_to_its_line(tmp_path):
    lin = torch.nn.Linear(4, 4)
    with tracer.trace(tmp_path):
        x = torch.randn(2, 4, requires_grad=True)
        y = lin(_IdentityF.apply(x))                  # F_LINE
        y.sum().backward()
    line = next(i for i, text in enumerate(open(HERE).read().splitlines(), 1)
                if text.rstrip().endswith("# F_LINE"))
    trace = tracer.load(tmp_path / "rank-0.arrow")
    mul = next(e for e in trace.records() if e["op"] == "aten.mul.Tensor")
    assert mul["phase"] == "backward"
    assert [f[1] for f in mul["fwd_stack"] if f[0] == HERE][0] == line


def test_stack_capture_with_its_caches_equals_a_fresh_walk():
    """The interner reuses the previous walk's outer frames; whatever the call pattern and depth
    limit, the stack it records must be the one a fresh walk records."""
    import random
    import sys as _sys

    from tracer.recorder.attribution.stacks import INTERNAL, StackInterner
    rng = random.Random(0)

    def internal(interner):
        """internal_ops stands for paratrace's own frames and torch's dispatch frames."""
        code = internal_ops.__code__
        interner.kind_of_code[id(code)] = (INTERNAL, False, code)
        return interner

    def check(interner, depth, frame=None):
        frame = frame or _sys._getframe(1)
        fresh = internal(StackInterner(depth=depth))
        assert interner.values[interner.capture(frame)] == fresh.values[fresh.capture(frame)]

    def internal_ops(interner, depth):      # ops issued from two lines of an internal frame
        check(interner, depth, _sys._getframe(0))
        check(interner, depth, _sys._getframe(0))

    def resumed(interner, depth, n):
        def generator():
            while True:
                descend(interner, depth, n)
                yield
        g = generator()
        next(g)
        next(g)                                 # the same generator frame, another caller

    def descend(interner, depth, n):
        for _ in range(rng.randint(1, 3)):
            if n > 0 and rng.random() < 0.6:
                descend(interner, depth, n - 1)
            elif n > 0 and rng.random() < 0.2:
                resumed(interner, depth, n - 1)
            elif rng.random() < 0.2:
                internal_ops(interner, depth)
            elif rng.random() < 0.5:
                check(interner, depth)
            else:
                check(interner, depth)          # same frame, another instruction

    for depth in (3, 6, 32):
        interner = internal(StackInterner(depth=depth))
        for _ in range(30):
            descend(interner, depth, rng.randint(0, 9))


def _record_batches(path) -> list:
    """(start, end) byte offsets of each record batch message of a trace file."""
    spans = []
    with pa.OSFile(str(path)) as source:
        reader = pa.ipc.MessageReader.open_stream(source)
        while True:
            start = source.tell()
            try:
                message = reader.read_next_message()
            except StopIteration:
                break
            if message.type == "record batch":
                spans.append((start, source.tell()))
    return spans


def test_a_cut_in_the_last_batch_keeps_every_finished_step(tmp_path):
    torch.manual_seed(0)
    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    # the default flush interval; no memory rows: their batch would come last, after the op
    # rows', and a cut in it would lose no op row
    with tracer.trace(tmp_path / "run", clock_sync=False, memory=False):
        for _ in range(3):
            net(torch.randn(2, 8)).sum().backward()
            opt.step()
            opt.zero_grad()
        with torch.no_grad():
            net(torch.randn(2, 8))                               # step 3, never finished
    path = tmp_path / "run" / "rank-0.arrow"
    whole = tracer.load(path)
    start, end = _record_batches(path)[-1]
    cut = tmp_path / "cut.arrow"
    cut.write_bytes(path.read_bytes()[: (start + end) // 2])
    trace = tracer.load(cut)
    assert not trace.complete and trace.warnings
    assert len(trace) < len(whole)                     # the cut did lose the last batch's rows
    finished = [e for e in whole.records() if e["step"] < 3]
    assert {e["step"] for e in finished} == {0, 1, 2}
    assert [e for e in trace.records() if e["step"] < 3] == finished


def test_the_status_file_says_what_record_config_set(tmp_path):
    with tracer.trace(tmp_path, clock_sync=False):
        tracer.record_config(steps=3, tp=2)
        torch.ones(1).add(1)
        tracer.record_config(tp=4)
    status = json.loads((tmp_path / "rank-0.status.json").read_text())
    assert status["config"] == {"steps": 3, "tp": 4}
    assert set(status) == {"rank", "pid", "now_ns", "status", "step", "last_event_ns", "events",
                           "last_collective", "inflight", "failed_collectives", "error", "trace",
                           "final", "config"}
    assert status["final"] and status["status"] == "ok" and status["events"] >= 1


def test_a_generator_resumed_by_another_caller_gets_that_callers_stack():
    """A generator frame at the same instruction can be resumed from a different caller: its
    stack must name the caller of this resumption, not the last one."""
    import sys as _sys

    from tracer.recorder.attribution.stacks import StackInterner
    from tracer.files.format import decode_stack
    interner = StackInterner(depth=8)

    def produce():
        while True:
            yield interner.capture(_sys._getframe(0))

    source = produce()

    def first_caller():
        return next(source)

    def second_caller():
        return next(source)

    stacks = [decode_stack(interner.values[sid]) for sid in (first_caller(), second_caller())]
    assert [[f[2] for f in s[:2]] for s in stacks] == [["produce", "first_caller"],
                                                       ["produce", "second_caller"]]


def test_a_torch_that_cannot_run_compiled_code_under_a_mode_is_said_in_the_trace(tmp_path,
                                                                                  monkeypatch):
    """Before torch 2.9 Dynamo skips every frame under any dispatch mode: the trace must not
    claim that compiled code ran compiled."""
    import tracer.recorder.frameworks.compiled
    monkeypatch.setattr(tracer.recorder.frameworks.compiled, "SUPPORTED", False)
    with tracer.trace(tmp_path, clock_sync=False):
        torch.ones(2).add_(1)
    options = tracer.load(tmp_path / "rank-0.arrow").meta["options"]
    assert options["compiled"] == "eager" and "torch >= 2.9" in options["compiled_why"]
    monkeypatch.setattr(tracer.recorder.frameworks.compiled, "SUPPORTED", True)
    with tracer.trace(tmp_path / "now", clock_sync=False):
        torch.ones(2).add_(1)
    options = tracer.load(tmp_path / "now" / "rank-0.arrow").meta["options"]
    assert options["compiled"] == "compiled" and "compiled_why" not in options


def test_the_first_op_of_a_trace_is_forward_only_if_autograd_records_it(tmp_path):
    """The recorder tells a forward op by the autograd nodes it made since the last op; before
    the first op there is no last op, and the first one (a tensor made outside modules, without
    gradients) was called forward."""
    with tracer.trace(tmp_path, clock_sync=False, device_time=False):
        a = torch.ones(2)                     # no node: other
        b = a * 2                             # no node: other
        w = torch.ones(2, requires_grad=True)
        (w * b).sum()                         # nodes: forward
    phases = [(e["op"], e["phase"]) for e in tracer.load(tmp_path / "rank-0.arrow").records()]
    assert phases[:3] == [("aten.ones.default", "other"), ("aten.mul.Tensor", "other"),
                          ("aten.ones.default", "other")]
    assert ("aten.mul.Tensor", "forward") in phases[3:]
