"""on_op's common path in C (tracer/recorder/csrc/hotpath/onop.c) against Session.on_op, its twin:
which ops take which path, what C shares with Python (labels, bounds, the clock), and what C must
not do (leak a reference, swallow the op's own error, lose a row when its bounds are reached; a
failure of the recorder's own work leaves the op its result). That the two record the same rows:
tests/integration/test_hotpath.py's test_either_hot_path_records_the_same_rows."""
from __future__ import annotations

import collections
import functools
import gc
import os
import shutil
import sys
import sysconfig
import time

import pytest
import torch

import tracer
from tracer.recorder import rows, session as session_module
from tracer.recorder.hotpath._mode import RecordingMode
from tracer.vocab import labels, ops

# Where the C path can be built and is not declined, it must be there (see the test below).
_C_EXPECTED = (sys.implementation.name == "cpython" and sys.version_info >= (3, 11)
               and os.environ.get("PARATRACE_PURE_PYTHON", "") in ("", "0")
               and shutil.which(sysconfig.get_config_var("CC").split()[0] or "cc") is not None
               and os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))
needs_c_path = pytest.mark.skipif(not session_module.C_ON_OP,
                                  reason="on_op's C path is not built or not asked for")


def test_the_c_path_is_built_wherever_it_can_be():
    """setup.py builds the extension as optional: a failed build installs silently in Python,
    and every test below would skip. Where a compiler and Python's headers exist, fail instead."""
    if not _C_EXPECTED:
        pytest.skip("no compiler or headers, CPython < 3.11, or PARATRACE_PURE_PYTHON set")
    assert session_module.C_ON_OP, "tracer.recorder._hotpath is not built: run setup.py build_ext"


# set only while memory is recorded (csrc/hotpath/hotpath.h)
MEMORY_FIELDS = ("memory_table",)


def _unset_c_fields(session, memory: bool = False) -> list:
    """The members of the C base that are unset: what the Python side no longer writes."""
    from tracer.recorder import _hotpath
    names = [name for name, value in vars(_hotpath.SessionState).items()
             if type(value).__name__ == "member_descriptor"
             and (memory or name not in MEMORY_FIELDS)]
    return [name for name in names if getattr(session, name, None) is None]


@needs_c_path
def test_an_ordinary_session_is_ready_for_the_c_path(tmp_path):
    """A field sessiontypes.c reads that the session stops setting (say, renamed on one side)
    would send every op to the Python twin, silently: only the wall time would show it."""
    with tracer.trace(tmp_path, clock_sync=False) as session:
        _loop(steps=1)
        assert session._c_ready, f"unset C fields: {_unset_c_fields(session)}"
        assert _unset_c_fields(session) == []
        queue = session._queue
        del session._queue                 # what a rename on one side would leave unset
        try:
            assert not session._c_ready and _unset_c_fields(session) == ["_queue"]
        finally:
            session._queue = queue
        assert session._c_ready


@needs_c_path
def test_a_session_recording_memory_is_ready_for_the_c_path(tmp_path):
    """With memory on, the C on_op calls the memory recorder's C storage table
    (csrc/hotpath/storagetable.c); set to anything else, the ops go to the Python twin rather than
    lose their storages."""
    with tracer.trace(tmp_path, clock_sync=False, memory=True) as session:
        _loop(steps=1)
        assert session._c_ready and _unset_c_fields(session, memory=True) == []
        assert session.memory_table is session._memory.table and len(session._memory.live)
        table = session.memory_table
        session.memory_table = {}
        try:
            assert not session._c_ready
        finally:
            session.memory_table = table
        assert session._c_ready
    assert session.memory_table is None           # closed: the C on_op stops calling it


@pytest.fixture
def python_calls(monkeypatch):
    """op name -> how many times the Python __torch_dispatch__ ran it on plain tensors (in
    traces started after this); torch gives some ops ``types`` (torch.Tensor,), which the
    Python path takes as a subclass's (dtensor.py), on either path."""
    calls = collections.Counter()
    python_dispatch = RecordingMode.__torch_dispatch__

    def counted(self, func, types, args=(), kwargs=None):
        if not types:
            calls[str(func)] += 1
        return python_dispatch(self, func, types, args, kwargs)

    monkeypatch.setattr(RecordingMode, "__torch_dispatch__", counted)
    return calls


def _loop(steps=3):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.AdamW(model.parameters())
    for _ in range(steps):
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        opt.zero_grad()


@needs_c_path
def test_the_c_path_shares_the_phases_bounds_and_row_layout_of_python():
    from tracer.recorder import _hotpath
    for name in ("OTHER", "FORWARD", "BACKWARD", "RECOMPUTE", "GRAD_SYNC", "OPTIMIZER"):
        assert getattr(_hotpath, f"PHASE_{name}") == getattr(labels, f"PHASE_{name}")
    assert (_hotpath.MAX_QUEUE, _hotpath.MAX_NODES) == (session_module.MAX_QUEUE,
                                                         session_module.MAX_NODES)
    assert _hotpath.ROW_FIELDS * 8 == rows.RECORD.size


@needs_c_path
def test_the_c_clock_is_perf_counter_ns():
    from tracer.recorder import _hotpath
    for _ in range(1000):
        before = time.perf_counter_ns()
        now = _hotpath.now()
        assert before <= now <= time.perf_counter_ns()


@needs_c_path
def test_plain_ops_take_the_c_path_and_the_rest_python(tmp_path, python_calls):
    with tracer.trace(tmp_path, clock_sync=False) as session:
        mode = session._mode
        assert type(mode.__dict__["__torch_dispatch__"]).__name__ == "OpDispatch"
        _loop()
    assert "__torch_dispatch__" not in mode.__dict__       # dispatch_in_python undid it
    trace = tracer.load(tmp_path / "rank-0.arrow")
    assert trace.meta["hot_path"] == "c"
    recorded = collections.Counter(r["op"] for r in trace.records()
                                   if r["op"].startswith("aten."))
    assert sum(recorded.values()) > 150
    for op, count in python_calls.items():
        overload = functools.reduce(getattr, op.split("."), torch.ops)
        if op.startswith("aten.") and ops.classify(overload).special is None:
            assert count == 1, (op, count)     # its first call, which classifies it
    assert sum(python_calls.values()) < sum(recorded.values()) / 3


@needs_c_path
def test_an_op_that_fails_on_the_c_path_raises_and_records_nothing(tmp_path, python_calls):
    with tracer.trace(tmp_path, clock_sync=False):
        a, b = torch.ones(2), torch.ones(3)
        torch.add(a, a)
        torch.add(a, a)                  # the C path from here on
        with pytest.raises(RuntimeError, match="size of tensor"):
            torch.add(a, b)
        torch.add(b, b)
    assert python_calls["aten.add.Tensor"] == 1
    added = [r["shapes"] for r in tracer.load(tmp_path / "rank-0.arrow").records()
             if r["op"] == "aten.add.Tensor"]
    assert added == ["f32[2] f32[2]", "f32[2] f32[2]", "f32[3] f32[3]"]


class _FailingHint:
    """An annotation stack whose phase hint raises (the op has run when C reads it)."""
    current = -1

    @property
    def phase_hint(self):
        raise KeyError("phase hint failed")


@needs_c_path
def test_an_error_in_what_the_c_path_reads_leaves_the_op_its_result(tmp_path, python_calls,
                                                                    capfd):
    # the run goes on (tracer/recorder/passthrough.py): the op's result, and nothing recorded
    # after (tests/unit/test_recorder_faults.py plants the recorder's other faults)
    x = torch.ones(2)
    with tracer.trace(tmp_path, clock_sync=False) as session:
        torch.neg(x)
        annotations, session._annotations = session._annotations, _FailingHint()
        try:
            assert torch.neg(x).tolist() == [-1.0, -1.0]
        finally:
            session._annotations = annotations
        torch.neg(x)
    assert python_calls["aten.neg.default"] == 1
    trace = tracer.load(tmp_path / "rank-0.arrow")
    negs = [r for r in trace.records() if r["op"] == "aten.neg.default"]
    assert len(negs) == 1
    assert trace.meta["recorder_error"] == {"error": "KeyError: 'phase hint failed'", "step": 0}
    assert capfd.readouterr().err.count("the recorder failed") == 1


@needs_c_path
def test_the_c_path_holds_no_reference_it_does_not_release(tmp_path):
    x = torch.ones(300, 1)
    add = torch.ops.aten.add.Tensor

    def ops_on(count):
        for _ in range(count):
            torch.add(x, x)
            torch.mul(x, 2.0)

    with tracer.trace(tmp_path, clock_sync=False) as session:
        ops_on(10)
        # collected before both counts: a cycle left by an earlier test (on Python 3.13, most
        # likely the failing op's traceback, holding aten.add.Tensor) would go between them
        gc.collect()
        refs = sys.getrefcount(x), sys.getrefcount(add)
        ops_on(2000)
        gc.collect()
        after = sys.getrefcount(x), sys.getrefcount(add)
        assert after == refs
        session._flusher.flush()
        assert len(session._queue) == 0
    assert sum(r["op"] in ("aten.add.Tensor", "aten.mul.Tensor")
               for r in tracer.load(tmp_path / "rank-0.arrow").records()) == 4020


@needs_c_path
def test_the_c_path_flushes_a_full_queue_and_rolls_the_node_table(tmp_path):
    x = torch.ones(2, requires_grad=True)
    with tracer.trace(tmp_path, clock_sync=False) as session:
        (x * 2).sum()
        (x * 2).sum()                          # both ops classified: the C path from here on
        filler = rows.record(t0=1, t1=1, op=session.op_ids("filler"), phase=labels.PHASE_OTHER,
                             step=0, thread=0)
        session._queue.extend([filler] * (session_module.MAX_QUEUE + 1))
        full_table = {n: 0 for n in range(session_module.MAX_NODES + 1)}
        session.fwd_of_node = full_table
        y = x * 2                                # one node: the table is past its bound
        assert len(session._queue) == 0          # flushed by the op that found it full
        assert session.fwd_prev is full_table and len(session.fwd_of_node) == 0
        y.sum().backward()
    trace = tracer.load(tmp_path / "rank-0.arrow")
    assert len(trace) > session_module.MAX_QUEUE          # the filler was written, not lost
    mul = trace.dictionary("op").index("aten.mul.Tensor")
    backward = (trace.col("phase") == labels.PHASE_BACKWARD) & (trace.col("op") == mul)
    # the node made before the roll is found in the previous table: its forward line stays
    assert backward.sum() == 1 and (trace.col("fwd_stack")[backward] >= 0).all()


@needs_c_path
def test_op_dispatch_checks_what_it_is_given():
    from tracer.recorder import _hotpath
    with pytest.raises(TypeError):
        _hotpath.OpDispatch(object(), object(), print)        # not a session
    state = _hotpath.SessionState()
    with pytest.raises(TypeError, match="not callable"):
        _hotpath.OpDispatch(object(), state, 5)
    calls = []
    dispatch = _hotpath.OpDispatch("mode", state, lambda *a: calls.append(a) or "python")
    assert dispatch.__self__ == "mode"
    # a session not set up takes nothing on the C path: the fallback runs
    assert dispatch(torch.ops.aten.neg.default, (), (torch.ones(1),), {}) == "python"
    assert len(calls) == 1
    with pytest.raises(TypeError, match="must be bool"):
        state.passthrough = 1
