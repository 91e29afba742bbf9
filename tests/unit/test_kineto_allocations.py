"""An export's ``[memory]`` events imported as memory rows (tracer.kineto.allocations): one device's
(CUDA's over the CPU's), an allocation linked to the op that holds it, a free of an address
allocated before the export, the peak against a count made from the JSON apart, and each
block's category told by the phases of the ops around it."""
from __future__ import annotations

import json

import pytest

from support.kineto_exports import BASE, export, json_memory_peak, write
from tracer.files.format import MEMORY_CATEGORIES
from tracer.files.reader import load
from tracer.kineto.convert import import_export
from viz.analysis.memory.live_bytes import memory_profile, peak_scope


def _mem(ts: float, addr: int, nbytes: int, device_type: int = 0, tid: int = 1) -> dict:
    return {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": 1,
            "tid": tid, "ts": ts, "args": {"Addr": addr, "Bytes": nbytes,
                                           "Total Allocated": 0, "Total Reserved": 0,
                                           "Device Id": 0 if device_type else -1,
                                           "Device Type": device_type}}


def _imported(tmp_path, events: list):
    data = export()          # aten::mm at 10-30.5, 110-130.5, 210-230.5 us on tid 1
    data["traceEvents"] += events
    path = write(tmp_path / "e.json", data)
    done = import_export(str(path), str(tmp_path), "rank-0")
    return load(done.trace), done


def test_allocations_link_to_their_op_and_the_peak_is_the_jsons(tmp_path):
    events = [_mem(15, 0xA0, 400), _mem(20, 0xB0, 100), _mem(25, 0xB0, -100),
              _mem(50, 0xC0, 1000),                    # outside every op
              _mem(60, 0xF0, -64),                     # allocated before the export
              _mem(120, 0xA0, -400), _mem(125, 0xA0, 300)]
    trace, done = _imported(tmp_path, events)
    mem = trace.memory
    assert mem is not None and len(mem.kind) == len(events)
    ops = trace.dictionary("op")
    t0, op = trace.col("t0"), trace.col("op")
    allocs = [i for i in range(len(mem.kind)) if mem.kind[i] == 0]
    linked = [ops[op[mem.row[i]]] if mem.row[i] >= 0 else None for i in allocs]
    assert linked == ["aten.mm", "aten.mm", None, "aten.mm"]
    assert t0[mem.row[allocs[0]]] == BASE + 10_000        # held by the first mm (10-30.5 us)
    # the peak, counted from the JSON apart: 400 + 100, then 400 + 1000 live at 50 us
    profile = memory_profile(trace)
    peak = json_memory_peak(events)
    assert profile.peak_bytes == peak == 1400
    assert set(profile.at_peak["category"]) >= {"temporaries"} and \
        profile.at_peak["category"]["temporaries"] == 1400     # plain mm ops: no phase
    assert any("not tensors" in m for m in done.missing)
    assert any(m.startswith("which memory is gradients, optimizer state or activations (no "
                            "forward, backward or optimizer op") for m in done.missing)


def test_cuda_allocations_are_kept_over_the_cpus(tmp_path):
    trace, _ = _imported(tmp_path, [_mem(15, 0xA0, 400), _mem(16, 0xD0, 4096, device_type=1),
                                    _mem(17, 0xD0, -4096, device_type=1)])
    assert trace.memory.bytes.tolist() == [4096, 4096]
    assert trace.meta["imported"]["memory_device"] == "cuda"


def test_an_export_without_memory_says_so(tmp_path):
    trace, done = _imported(tmp_path, [])
    assert trace.memory is None and trace.meta["imported"]["memory_device"] is None
    assert "memory (profiled without profile_memory)" in done.missing
    assert json.loads(json.dumps(trace.meta["imported"])) == trace.meta["imported"]


def _op(name: str, ts: float, dur: float, **args) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": 1, "ts": ts,
            "dur": dur, "args": args}


def _range(name: str, ts: float, dur: float, cat: str = "user_annotation") -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
            "args": {}}


def test_each_block_is_classed_by_the_phases_around_it(tmp_path):
    """A step: forward ops (grad mode on: a sequence number), the backward inside the
    autograd engine's ranges, AdamW's step; then the next step's forward. Which block lives
    when is made up here, so each category is known."""
    events = [_op("aten::linear", 310, 10, **{"Sequence number": 1}),      # forward
              _op("aten::relu", 330, 10, **{"Sequence number": 2}),
              _range("autograd::engine::evaluate_function: ReluBackward0", 400, 20, "cpu_op"),
              _op("aten::threshold_backward", 402, 10),                    # backward
              _range("autograd::engine::evaluate_function: AddmmBackward0", 430, 20, "cpu_op"),
              _op("aten::mm", 432, 10),
              _range("Optimizer.step#AdamW.step", 500, 100),
              _op("aten::zeros_like", 510, 5), _op("aten::mul", 530, 5),   # optimizer
              _op("aten::linear", 700, 10, **{"Sequence number": 3})]      # next forward
    memory = [_mem(312, 0xA0, 1000),       # linear out, freed in forward: temporaries
              _mem(332, 0xB0, 2000),       # relu out, saved, freed in backward: activations
              _mem(335, 0xA0, -1000),
              _mem(404, 0xC0, 300),        # a gradient, alive at the optimizer step
              _mem(407, 0xB0, -2000),
              _mem(434, 0xD0, 50),         # a backward scratch, freed before the step
              _mem(440, 0xD0, -50),
              _mem(512, 0xE0, 600),        # exp_avg: outlives the step
              _mem(532, 0xF0, 70),         # the step's scratch
              _mem(534, 0xF0, -70),
              _mem(560, 0xC0, -300),       # zero_grad(set_to_none)
              _mem(702, 0x1A0, 1000)]      # the next forward's output, never freed
    data = export(kernels=0)
    data["traceEvents"] += events + memory
    done = import_export(str(write(tmp_path / "e.json", data)), str(tmp_path), "rank-0")
    mem = load(done.trace).memory
    category = dict(zip(mem.storage.tolist(), mem.category.tolist()))
    named = {sid: MEMORY_CATEGORIES[c] for sid, c in category.items()}
    assert [named[s] for s in sorted(named)] == [
        "temporaries", "activations", "gradients", "temporaries", "optimizer_state",
        "temporaries", "temporaries"]
    # every event of a storage carries its category, the free as its allocation
    assert all(category[s] == c for s, c in zip(mem.storage.tolist(), mem.category.tolist()))
    assert not any(m.startswith("which memory") for m in done.missing)


@pytest.mark.parametrize("last", ["optimizer", "backward"])
def test_an_export_that_ends_before_the_next_phase_keeps_what_outlives_it(tmp_path, last):
    """The profile stops after the optimizer step (or after the backward): AdamW's state (a
    gradient), never freed in it, is state (a gradient); scratch freed at once is not."""
    events = [_op("aten::linear", 310, 10, **{"Sequence number": 1}),
              _range("autograd::engine::evaluate_function: AddmmBackward0", 400, 20, "cpu_op"),
              _op("aten::mm", 402, 10)]
    memory = [_mem(404, 0xC0, 300), _mem(405, 0xD0, 30), _mem(406, 0xD0, -30)]
    if last == "optimizer":
        events += [_range("Optimizer.step#AdamW.step", 500, 100),
                   _op("aten::zeros_like", 510, 5)]
        memory += [_mem(512, 0xE0, 600), _mem(513, 0xF0, 70), _mem(514, 0xF0, -70)]
    data = export(kernels=0)
    data["traceEvents"] += events + memory
    done = import_export(str(write(tmp_path / "e.json", data)), str(tmp_path), "rank-0")
    mem = load(done.trace).memory
    named = {s: MEMORY_CATEGORIES[c] for s, c in zip(mem.storage.tolist(),
                                                     mem.category.tolist())}
    assert named == ({0: "gradients", 1: "temporaries", 2: "optimizer_state",
                      3: "temporaries"} if last == "optimizer"
                     else {0: "gradients", 1: "temporaries"})


def test_the_allocators_own_peak_is_kept_beside_for_the_device_imported(tmp_path):
    """torch's "Total Allocated" holds what was allocated before the export began: the largest
    of the kept device's is written beside the rows (the CPU's is not the CUDA peak)."""
    events = [_mem(15, 0xA0, 400), _mem(16, 0xD0, 4096, device_type=1),
              _mem(17, 0xD0, -4096, device_type=1)]
    for e, total in zip(events, (9_000_000, 700_000, 695_904)):
        e["args"]["Total Allocated"] = total
    trace, _ = _imported(tmp_path, events)
    assert trace.meta["imported"]["memory_allocated_peak"] == 700_000
    scope = peak_scope(trace.meta)
    assert (scope.scope, scope.allocated_peak) == ("export", 700_000)
    assert memory_profile(trace).peak_bytes == 4096       # made within the export
    assert peak_scope({}).scope == "recording" and peak_scope({}).allocated_peak is None
    del events[1]["args"]["Total Allocated"], events[2]["args"]["Total Allocated"]
    (tmp_path / "without").mkdir()
    trace, _ = _imported(tmp_path / "without", events)
    assert trace.meta["imported"]["memory_allocated_peak"] is None
