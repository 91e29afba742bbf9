"""Memory recording's storage table, its C twin (csrc/hotpath/storagetable.c) against the Python one
(tracer/recorder/memory/storage_table.py), call for call on the same tensors: the same events in the
same order (times aside), packed the same. The traces both record are compared in
tests/integration/test_hotpath.py."""
from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

from tracer.recorder import compat
from tracer.recorder.hotpath._native import native_hot_path
from tracer.recorder.memory.storage_table import (ACTIVATIONS, ALLOC, EVENT, FREE, GRADIENTS,
                                           PARAMETERS, RECLASS, TEMPORARIES, PyStorageTable)

HOT = native_hot_path()
pytestmark = pytest.mark.skipif(HOT is None, reason="the C hot path is not built")


def _script(table, session) -> None:
    """Every kind of call, on fresh tensors: first sights (an alias-only op's outputs are not
    looked at), a parameter and its gradient claimed, a saved tensor, a backward node's saved
    tensors, a resize to 0 and back, frees."""
    a, b = torch.ones(4), torch.zeros(2, 3)
    table.outputs(torch.ops.aten.add.Tensor, a, 10, 0, False)
    table.outputs(torch.ops.aten.split.Tensor, (b, torch.ones(1)), 11, 0, False)   # aliases
    table.outputs(torch.ops.aten.max.dim, (b, torch.ones(2)), 12, 1, False)
    session.step_index = 1
    param = torch.nn.Parameter(torch.ones(8))
    param.grad = torch.ones(8)
    table.claim(param, PARAMETERS)
    table.claim(param.grad, GRADIENTS)
    table.claim(param, PARAMETERS)                 # there at that category: nothing
    table.saved(b)
    x = torch.ones(3, requires_grad=True)
    y = (x * 2).relu()                             # ReluBackward0 saved its result
    table.outputs(torch.ops.aten.relu.default, y, 13, 0, False)
    table.node_runs(y.grad_fn, y.grad_fn._sequence_nr())
    table.node_runs(y.grad_fn, y.grad_fn._sequence_nr())   # the same node again: read once
    storage = a.untyped_storage()
    storage.resize_(0)
    table.resized(storage)
    storage.resize_(16)
    table.resized(storage)
    del a, b, y, storage
    gc.collect()


def _events(table) -> list:
    rows = np.frombuffer(table.take(), dtype=np.int64).reshape(-1, EVENT.size // 8)
    return [tuple(int(v) for k, v in enumerate(row) if k != 3) for row in rows]   # no time


def test_the_c_table_records_what_its_python_twin_does():
    runs = []
    for make in (lambda s: PyStorageTable(s),
                 lambda s: HOT.StorageTable(s, compat.storage_key, torch.Tensor,
                                            compat.returns_only_aliases)):
        session = HOT.SessionState()
        table = make(session)
        _script(table, session)
        runs.append(_events(table))
        assert table.take() == b""                 # taken: nothing twice
        table.close()
        assert not table.live
    python, c = runs
    assert c == python
    # (kind, storage id, bytes, category, thread, step), from the script's own steps: a's 16
    # bytes by add; b's 24 and max's indices (8, freed at once) by max (split's not seen); the
    # parameter and its gradient, 32 each, found by claims in step 1; b saved (activations);
    # relu's result (12) by relu, and saved by its node; a's storage resized to 0 (freed) and
    # to 16 (a new id, same category); the frees as the script drops them
    assert c == [
        (ALLOC, 0, 16, TEMPORARIES, 0, 0), (ALLOC, 1, 24, TEMPORARIES, 1, 0),
        (ALLOC, 2, 8, TEMPORARIES, 1, 0), (FREE, 2, 8, TEMPORARIES, -1, 0),
        (ALLOC, 3, 32, PARAMETERS, -1, 1), (ALLOC, 4, 32, GRADIENTS, -1, 1),
        (RECLASS, 1, 24, ACTIVATIONS, -1, 1), (ALLOC, 5, 12, TEMPORARIES, 0, 1),
        (RECLASS, 5, 12, ACTIVATIONS, -1, 1), (FREE, 0, 16, TEMPORARIES, -1, 1),
        (ALLOC, 6, 16, TEMPORARIES, -1, 1), (FREE, 1, 24, ACTIVATIONS, -1, 1),
        (FREE, 5, 12, ACTIVATIONS, -1, 1), (FREE, 6, 16, TEMPORARIES, -1, 1),
        (FREE, 4, 32, GRADIENTS, -1, 1), (FREE, 3, 32, PARAMETERS, -1, 1)]
