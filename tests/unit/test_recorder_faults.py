"""The run goes on when the recorder fails (tracer/recorder/passthrough.py): a fault planted in
the recorder's own work around an op (a new stack node, a code object's classification, a
storage's first sight, a shape key, the queue, an op's classification, the device recorder's
start, a record_function range's bookkeeping) never reaches the training step. The op returns its
result (an in-place op has run once), the rank records nothing more, the trace's metadata says
why (``recorder_error``) and stderr says it once. On the C hot path (csrc/hotpath/onop.c) and on its
Python twin (Session.on_op), each."""
from __future__ import annotations

import collections

import pytest
import torch

import tracer
from tracer.recorder import session as session_module
from tracer.recorder.hotpath._mode import RecordingMode
from tracer.vocab import ops

PATHS = ["c", "python"]


class Planted(RuntimeError):
    """The fault a test plants in the recorder."""


def boom(*args, **kwargs):
    raise Planted("planted in the recorder")


@pytest.fixture(params=PATHS)
def hot_path(request, monkeypatch):
    """Which on_op records: the C path where built, or the Python twin."""
    if request.param == "c" and not session_module.C_ON_OP:
        pytest.skip("on_op's C path is not built or not asked for")
    if request.param == "python":
        monkeypatch.setattr(session_module, "C_ON_OP", False)
    return request.param


@pytest.fixture
def python_calls(monkeypatch):
    """op name -> how many times the mode's Python __torch_dispatch__ took it."""
    calls = collections.Counter()
    python_dispatch = RecordingMode.__torch_dispatch__

    def counted(self, func, types, args=(), kwargs=None):
        calls[str(func)] += 1
        return python_dispatch(self, func, types, args, kwargs)

    monkeypatch.setattr(RecordingMode, "__torch_dispatch__", counted)
    return calls


def warm_up(x) -> None:
    """Each op the faults meet, classified (its first call takes the Python path)."""
    y = x.clone()
    y.mul_(3), y.sub_(1), y.add(1), torch.mul(y, torch.ones(2, 1)), torch.exp(y)


def fresh_in_place(x):              # a function no trace has seen: a new stack node
    return x.mul_(3)


def fresh_new_storage(x):
    return x.add(1)


def fresh_classified(x):            # a code object not classified yet
    return x.sub_(1)


class FailingDevice:
    """A device recorder whose start fails with no RuntimeError (which it would say itself)."""
    error, errors = None, 0

    def start(self):
        raise Planted("planted in the device's start")

    def boundary(self, recording):
        return False

    def write_pending(self):
        pass

    def close(self):
        pass

    def meta(self):
        return {"source": "failing", "windows": 0, "error": None}


def plant_node(session):
    session._stacks._new_node = boom


def plant_classify(session):
    session._stacks.classify = boom


# the storage table's key lookup, armed by plant_first_sight to fail once: the storage table
# (C or its Python twin) takes the function when a trace starts, so the fixture puts it in first
_ARMED: list = []


# a LookupError: the table reads a RuntimeError, NotImplementedError or TypeError as a tensor
# without a storage (sparse, nested), which it passes over
PlantedInTable = type("Planted", (LookupError,), {})


def _once_armed(real):
    def storage_key(tensor):
        if _ARMED:
            _ARMED.clear()
            raise PlantedInTable("planted in the recorder")
        return real(tensor)
    return storage_key


@pytest.fixture(autouse=True)
def plantable_storage_key(monkeypatch):
    from tracer.recorder.memory import memory_recorder as memory_module, storage_table
    for module in (memory_module, storage_table):
        monkeypatch.setattr(module, "storage_key", _once_armed(module.storage_key))
    yield
    _ARMED.clear()


def plant_first_sight(session):
    _ARMED.append(True)               # the next storage the table looks up: a new one


def plant_shape_key(session):
    session._signatures._id_of_new = boom


def plant_queue(session):
    session.push = boom


def plant_device(session):
    session._device, session.device_wanted = FailingDevice(), True


# (name, what is planted, the op that meets it and its name, its expected result, memory
# recorded). The device's start is the Python twin's on either path (the C path leaves an op
# to it while a device recording waits to start).
FAULTS = [
    ("_new_node", plant_node, lambda x: fresh_in_place(x), "aten.mul_.Tensor", [3.0, 6.0],
     False),
    ("classify", plant_classify, lambda x: fresh_classified(x), "aten.sub_.Tensor",
     [0.0, 1.0], False),
    ("first_sight", plant_first_sight, lambda x: fresh_new_storage(x), "aten.add.Tensor",
     [2.0, 3.0], True),
    ("shape_key", plant_shape_key, lambda x: torch.mul(x, torch.ones(3, 1)), "aten.mul.Tensor",
     [[1.0, 2.0]] * 3, False),
    ("queue", plant_queue, lambda x: x.mul_(3), "aten.mul_.Tensor", [3.0, 6.0], False),
    ("device_start", plant_device, lambda x: x.mul_(3), None, [3.0, 6.0], False),
]


@pytest.mark.parametrize("name, plant, meet, op, expected, memory", FAULTS,
                         ids=[f[0] for f in FAULTS])
def test_a_recorder_fault_returns_the_ops_result_and_stops_recording(
        tmp_path, capfd, hot_path, python_calls, name, plant, meet, op, expected, memory):
    x = torch.tensor([1.0, 2.0])
    with tracer.trace(tmp_path, clock_sync=False, memory=memory) as session:
        warm_up(x)
        torch.neg(x)                       # recorded
        torch.neg(x)
        before = python_calls.copy()
        plant(session)
        out = meet(x)                      # no exception: the op's result
        assert out.tolist() == expected
        if hot_path == "c" and op is not None:
            assert python_calls[op] == before[op], "the fault was met on the Python path"
        after = torch.exp(torch.zeros(1))  # the rank records nothing more
        assert after.tolist() == [1.0] and session.passthrough
    trace = tracer.load(tmp_path / "rank-0.arrow")
    assert trace.meta["status"] == "ok" and trace.meta["error"] is None
    assert trace.meta["recorder_error"] == {"error": "Planted: planted in the recorder"
                                            if name != "device_start" else
                                            "Planted: planted in the device's start",
                                            "step": 0}
    recorded = [r["op"] for r in trace.records()]
    assert recorded.count("aten.neg.default") == 2 and recorded.count("aten.exp.default") == 1
    err = capfd.readouterr().err
    assert err.count("paratrace: rank 0: the recorder failed at step 0 (Planted: ") == 1
    assert "this rank records nothing more, the run goes on" in err


def test_an_ops_classification_that_fails_runs_the_op_unrecorded(tmp_path, capfd, hot_path,
                                                                 monkeypatch):
    x = torch.tensor([0.5, 2.0])
    with tracer.trace(tmp_path, clock_sync=False):
        torch.neg(x)
        monkeypatch.setattr(ops, "classify", boom)    # the next op overload never seen
        assert torch.special.erfcx(x).tolist() == torch.special.erfcx(x).tolist()
    monkeypatch.undo()
    trace = tracer.load(tmp_path / "rank-0.arrow")
    assert trace.meta["recorder_error"]["error"] == "Planted: planted in the recorder"
    assert "aten.special_erfcx.default" not in [r["op"] for r in trace.records()]
    assert capfd.readouterr().err.count("the recorder failed") == 1


def test_a_record_function_range_that_fails_goes_on_unrecorded(tmp_path, capfd, hot_path):
    x = torch.ones(2)
    with tracer.trace(tmp_path, clock_sync=False) as session:
        session._annotations.open_record_function = boom
        with torch.profiler.record_function("user_range"):
            y = x * 2
        assert y.tolist() == [2.0, 2.0]
    trace = tracer.load(tmp_path / "rank-0.arrow")
    assert trace.meta["recorder_error"]["error"] == "Planted: planted in the recorder"
    assert capfd.readouterr().err.count("the recorder failed") == 1


def train(steps: int, fault_at=None, session=None) -> list:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.randn(steps, 4, 8)
    losses = []
    for step in range(steps):
        if step == fault_at:
            session.push = boom
        loss = model(data[step]).pow(2).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses + [p.detach().clone() for p in model.parameters()]


def test_a_training_run_whose_recorder_fails_ends_as_untraced(tmp_path, capfd, hot_path):
    untraced = train(5)
    with tracer.trace(tmp_path, clock_sync=False) as session:
        traced = train(5, fault_at=2, session=session)
    assert traced[:5] == untraced[:5]                   # every loss, to the bit
    assert all(torch.equal(a, b) for a, b in zip(traced[5:], untraced[5:]))
    trace = tracer.load(tmp_path / "rank-0.arrow")
    assert trace.meta["recorder_error"] == {"error": "Planted: planted in the recorder",
                                            "step": 2}
    assert max(r["step"] for r in trace.records()) == 2      # steps 0, 1 and the step marker
    assert capfd.readouterr().err.count("the recorder failed") == 1


def test_the_users_keyboard_interrupt_is_not_the_recorders(tmp_path, hot_path):
    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    x = torch.ones(2)
    with pytest.raises(KeyboardInterrupt):
        with tracer.trace(tmp_path, clock_sync=False) as session:
            torch.neg(x)
            session.push = interrupt
            torch.neg(x)
    assert tracer.load(tmp_path / "rank-0.arrow").meta["status"] == "interrupted"
