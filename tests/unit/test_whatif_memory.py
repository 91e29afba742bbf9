"""What-if memory (viz.whatif.reference_gpt.gpt_memory): the micro-batches a stage holds at its
peak per schedule
(docs/oracles.md), and a model fitted on constructed peaks with known rates predicting a target
exactly, ZB-H1's deferred weight gradients included."""
from __future__ import annotations

import pytest

from viz.analysis.timeline.grid import Grid
from viz.whatif.reference_gpt.megatron import Shape
from viz.whatif.reference_gpt.megatron import shape_of
from tracer.vocab.schedules import zb_h1
from viz.whatif.reference_gpt.gpt_memory import (MemoryModel, elements, in_flight, unit,
                                                  w_pending, w_store)

BASE = Shape(layers=4, hidden=32, seq_len=16, vocab=256, micro_batch_size=2, pp=2,
             microbatches=4, schedule="1f1b")


def target_shape(base: Shape, changes: dict) -> Shape:
    """``base`` with a target's options, through the config as trace-whatif reads it."""
    return shape_of({**base.__dict__, **changes})


@pytest.mark.parametrize("schedule, v, held", [
    ("1f1b", 1, [2 * 2, 1 * 2]),          # min(m, p - r) micro-batches of 2 layers
    ("zb-h1", 1, [2 * 2, 1 * 2]),
    ("gpipe", 1, [4 * 2, 4 * 2]),          # all m
    ("interleaved", 2, [5 * 1, 3 * 1]),    # min(m v, 2 (p - r - 1) + (v - 1) p + 1) chunks of 1
])
def test_layers_worth_of_micro_batches_a_stage_holds_at_its_peak(schedule, v, held):
    shape = target_shape(BASE, {"schedule": schedule, "virtual_stages": v})
    assert [in_flight(shape, r) for r in range(2)] == held


def test_a_model_fitted_on_known_rates_predicts_a_target_exactly():
    grid = Grid(tp=1, cp=1, dp=1, pp=2)
    per_unit = {0: 3.0, 1: 5.0}           # the last stage keeps more (its head)
    peaks, own = {}, {}
    for r in range(2):
        n = elements(BASE, r)
        own[r] = {"parameters": 4 * n, "gradients": 4 * n, "optimizer_state": 8 * n}
        peaks[r] = {**own[r], "activations": in_flight(BASE, r) * unit(BASE) * per_unit[r],
                    "temporaries": 0.5 * unit(BASE), "comm": 0}
    model = MemoryModel(BASE, grid, peaks, own)
    gpipe = target_shape(BASE, {"schedule": "gpipe", "microbatches": 8})
    for r in range(2):
        got = model.predict(gpipe, r)["by_category"]
        n = elements(gpipe, r)
        assert got["parameters"] == 4 * n and got["optimizer_state"] == 8 * n
        assert got["gradients"] == 0             # GPipe's peak precedes every backward
        assert got["activations"] == pytest.approx(8 * 2 * unit(gpipe) * per_unit[r], abs=1)
        assert got["temporaries"] == pytest.approx(0.5 * unit(gpipe), abs=1)
    # tp 2 with SP, one stage: parameters from Megatron's rules, a unit 16 s b h / t
    tp2 = target_shape(BASE, {"tp": 2, "sp": True, "pp": 1})
    assert unit(tp2) == 16 * 2 * 32 * 16 / 2
    got = model.predict(tp2, 0)["by_category"]
    assert got["gradients"] == 4 * elements(tp2, 0)
    assert got["activations"] == pytest.approx(4 * unit(tp2) * (3.0 + 5.0) / 2, abs=1)


def _zb_h1_at_peak(p: int, m: int, r: int) -> tuple:
    """(micro-batches whose activations stage r holds, W passes pending) after the forward
    that leaves the most micro-batches in flight (the last such), walked from the order."""
    full, pending, best = 0, 0, (-1, -1)
    for action in zb_h1(stages=p, rank=r, microbatches=m):
        if action.kind == "F":
            full += 1
            best = max(best, (full, pending))
        elif action.kind == "B":
            full, pending = full - 1, pending + 1
        else:
            pending -= 1
    return best


@pytest.mark.parametrize("p, m", [(2, 4), (4, 8), (4, 2), (4, 4), (3, 5)])
def test_zb_h1_stage_holds_1f1b_micro_batches_and_up_to_r_pending_weight_passes(p, m):
    shape = Shape(layers=4 * p, hidden=32, seq_len=16, vocab=256, micro_batch_size=2, pp=p,
                  microbatches=m, schedule="zb-h1")
    for r in range(p):
        full, pending = _zb_h1_at_peak(p, m, r)
        assert in_flight(shape, r) == full * 4 and w_pending(shape, r) == pending, (r, full)
    assert all(w_pending(target_shape(shape, {"schedule": "1f1b"}), r) == 0 for r in range(p))


def test_a_pending_weight_pass_keeps_each_linear_layers_input_and_output_gradient():
    sbh, layers = 16 * 2 * 32, 2             # BASE: 4 layers over 2 stages
    kept = w_store(target_shape(BASE, {"schedule": "zb-h1"}))
    # inputs: qkv and fc1 s b h, proj s b h, fc2 4 s b h; one received s b h; fp32
    assert kept["activations"] == 4 * (layers * 7 * sbh + sbh)
    # output gradients: qkv 3 s b h, proj s b h, fc1 4 s b h, fc2 s b h
    assert kept["temporaries"] == 4 * layers * 9 * sbh
    sp = w_store(target_shape(BASE, {"schedule": "zb-h1", "tp": 2, "sp": True}))
    assert sp["activations"] == 4 * (layers * 7 * sbh / 2 + sbh / 2)
    assert sp["temporaries"] == 4 * layers * (2 + 7 / 2) * sbh


def test_a_zb_h1_recording_has_its_weight_store_taken_out_before_the_fit():
    grid = Grid(tp=1, cp=1, dp=1, pp=2)
    zb = target_shape(BASE, {"schedule": "zb-h1"})
    peaks, own = {}, {}
    for r in range(2):
        n = elements(zb, r)
        own[r] = {"parameters": 4 * n, "gradients": 4 * n, "optimizer_state": 8 * n}
        store = {c: w_pending(zb, r) * b for c, b in w_store(zb).items()}
        peaks[r] = {**own[r], "comm": 0,
                    "activations": in_flight(zb, r) * unit(zb) * 4 + store["activations"],
                    "temporaries": 0.5 * unit(zb) + store["temporaries"]}
    model = MemoryModel(zb, grid, peaks, own)
    one_f_one_b = target_shape(BASE, {"schedule": "1f1b"})
    for r in range(2):
        got = model.predict(one_f_one_b, r)["by_category"]
        assert got["activations"] == pytest.approx(in_flight(one_f_one_b, r) * unit(zb) * 4,
                                                   abs=1)
        assert got["temporaries"] == pytest.approx(0.5 * unit(zb), abs=1)
        again = model.predict(zb, r)
        assert again["peak_bytes"] == pytest.approx(sum(peaks[r].values()), abs=4)
