"""Rows and columns: the hot path builds its rows positionally, everything else by name; both must
put every value in the column format.COLUMNS names."""
from __future__ import annotations

import inspect
import os

import pytest
import torch
import torch.distributed as dist

import tracer
from tracer.files.format import COL, COLUMN_NAMES, NCOLS, make_row
from tracer.recorder.rows import COMM_ROW, OP_ROW

HERE = os.path.abspath(__file__)


def test_the_hot_path_row_layout_is_the_format_column_order():
    assert OP_ROW == COLUMN_NAMES[: len(OP_ROW)]
    assert OP_ROW + COMM_ROW == COLUMN_NAMES


def test_rows_built_by_name_put_each_value_in_its_column():
    row = make_row(t0=5, cid=7, shapes=3)
    assert len(row) == NCOLS
    assert (row[COL.t0], row[COL.cid], row[COL.shapes]) == (5, 7, 3)
    assert row.count(None) == NCOLS - 3
    with pytest.raises(TypeError, match="no trace column named 'cids'"):
        make_row(cids=1)


class Scale(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(3, 4))

    def forward(self, x):
        return torch.mm(x, self.weight)              # MM_LINE


MM_LINE = next(i for i, line in enumerate(inspect.getsource(Scale).splitlines())
               if "MM_LINE" in line) + inspect.getsourcelines(Scale)[1]


def test_every_column_of_an_op_and_a_collective_holds_its_own_value(tmp_path):
    """One recorded op and one collective, each column checked by name against a value no
    neighbouring column could hold."""
    store = dist.HashStore()
    with tracer.trace(tmp_path, clock_sync=False):
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        try:
            with tracer.annotate("F", microbatch=5):
                y = Scale()(torch.ones(2, 3))
                t = torch.ones(256)                  # 1 KiB of f32
                dist.all_reduce(t, async_op=True).wait()
            y.sum().backward()
        finally:
            dist.destroy_process_group()
    records = tracer.load(tmp_path / "rank-0.arrow").records()

    mm = next(e for e in records if e["op"] == "aten.mm.default" and e["phase"] == "forward")
    assert 0 < mm["t0"] <= mm["t1"]
    assert mm["module"] == "Scale"
    assert mm["stack"][0][:2] == (HERE, MM_LINE) and mm["fwd_stack"] == ()
    assert mm["annotation"] == [{"label": "F", "microbatch": 5}]
    assert (mm["step"], mm["thread"]) == (0, 0)
    assert mm["shapes"] == "f32[2,3] f32[3,4]"
    assert all(mm[name] is None for name in COMM_ROW)

    backward = next(e for e in records if e["op"] == "aten.mm.default"
                    and e["phase"] == "backward")
    assert backward["module"] == "Scale" and backward["fwd_stack"][0][:2] == (HERE, MM_LINE)

    reduce = next(e for e in records if e["kind"])
    assert reduce["op"] == "c10d.allreduce_.default" and reduce["phase"] == "forward"
    assert reduce["kind"] == "all_reduce" and reduce["group"] == (0,) and reduce["peer"] is None
    assert (reduce["bytes"], reduce["dtype"], reduce["async_op"]) == (1024, "f32", True)
    assert (reduce["seq"], reduce["cid"]) == (0, 0)
    assert reduce["t0"] <= reduce["t_ret"] <= reduce["t1"]
    assert reduce["shapes"] == "[f32[256]]"
    assert reduce["annotation"] == [{"label": "F", "microbatch": 5}]


def test_packed_records_round_trip_by_name_with_nulls():
    from tracer.recorder import rows
    packed = rows.record(t0=5, op=2, module=None, cid=9) + rows.record(t1=7, shapes=3)
    table = rows.unpack(packed)
    assert table.shape == (2, len(rows.RECORD_FIELDS))
    first = dict(zip(rows.RECORD_FIELDS, table[0].tolist()))
    assert (first["t0"], first["op"], first["module"], first["cid"], first["t1"]) == \
        (5, 2, -1, 9, -1)
    assert rows.comm_positions(table).tolist() == [0]
    with pytest.raises(TypeError, match="no packed column named 'kind'"):
        rows.record(kind=1)                      # held by comm.CommRecord, not the record


def test_recording_adds_no_objects_for_the_garbage_collector_to_chase(tmp_path):
    """Queued events are packed bytes, not tuples: a long recorded loop makes the collector
    run no more often than the same loop untraced (tuples made it run every ~700 events)."""
    import gc

    runs = []

    def count(phase, info):
        if phase == "start":
            runs.append(info["generation"])

    x = torch.ones(1)

    def loop():
        for _ in range(20_000):
            x.add_(1)

    gc.collect()
    gc.callbacks.append(count)
    try:
        loop()
        untraced = len(runs)
        with tracer.trace(tmp_path, clock_sync=False, flush_interval=60):
            del runs[:]
            loop()
            traced = len(runs)
    finally:
        gc.callbacks.remove(count)
    assert traced <= untraced + 2, (traced, untraced)
    assert (tracer.load(tmp_path / "rank-0.arrow").col("op") >= 0).sum() >= 20_000
