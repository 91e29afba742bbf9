"""What-if memory (viz.whatif.memory): the micro-batches a stage holds at its peak per schedule
(docs/oracles.md), and a model fitted on constructed peaks with known rates predicting a target
exactly."""
from __future__ import annotations

import pytest

from viz.analysis.grid import Grid
from viz.whatif.megatron import Shape
from viz.whatif.megatron import shape_of
from viz.whatif.memory import MemoryModel, elements, in_flight, unit

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
    # tp 2 with SP, one stage: parameters from Megatron's rules, a unit 34 / t per token
    tp2 = target_shape(BASE, {"tp": 2, "sp": True, "pp": 1})
    assert unit(tp2) == 16 * 2 * 32 * 34 / 2
    got = model.predict(tp2, 0)["by_category"]
    assert got["gradients"] == 4 * elements(tp2, 0)
    assert got["activations"] == pytest.approx(4 * unit(tp2) * (3.0 + 5.0) / 2, abs=1)
