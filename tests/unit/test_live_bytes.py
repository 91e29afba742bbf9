"""viz.analysis.memory.live_bytes on constructed memory events with known answers (the peak, the
split at the peak, frees, reclasses), and the memory rows' round trip through the trace format:
written beside op rows, split off by the reader and linked to their ops' rows."""
from __future__ import annotations

import numpy as np
import pyarrow as pa

import tracer
from tracer.files.format import MEMORY_CATEGORIES, MEMORY_KINDS, TraceWriter
from tracer.files.reader import MemoryEvents
from viz.analysis.memory.live_bytes import memory_profile, profile_events

A, F, R = (MEMORY_KINDS.index(k) for k in ("alloc", "free", "reclass"))
TEMP, ACT, GRAD, PARAM = (MEMORY_CATEGORIES.index(c) for c in
                          ("temporaries", "activations", "gradients", "parameters"))

# (kind, storage, bytes, t, category, step, row): s0 a parameter found by a walk; s1 an op's
# temporary saved for backward (activation); s2 a temporary freed; s3 a temporary found later
# to be a gradient; a free of a storage never allocated here (ignored). Given out of order.
EVENTS = [
    (R, 3, 40, 8, GRAD, 1, -1),
    (A, 0, 100, 1, PARAM, 0, -1),
    (A, 1, 50, 2, TEMP, 0, 0),
    (R, 1, 50, 3, ACT, 0, -1),
    (A, 2, 30, 4, TEMP, 0, 1),
    (F, 9, 500, 4, TEMP, 0, -1),
    (F, 2, 30, 5, TEMP, 0, -1),
    (A, 3, 40, 6, TEMP, 1, 2),
    (F, 1, 50, 7, ACT, 1, -1),
]


def events(rows=EVENTS) -> MemoryEvents:
    cols = [np.array(c, dtype=np.int64) for c in zip(*rows)]
    kind, storage, nbytes, t, category, step, row = cols
    return MemoryEvents(kind, storage, nbytes, t, category, np.full(len(t), -1), step, row)


def labels(rows):
    names = {0: "M.a", 1: "M.b", 2: "M.a"}
    return {"module": [names.get(r) for r in rows.tolist()],
            "phase": ["forward" if r in (0, 1) else "backward" if r == 2 else None
                      for r in rows.tolist()],
            "site": [f"train.py:{10 + r}" if r >= 0 else None for r in rows.tolist()]}


def test_peak_split_frees_and_reclasses():
    p = profile_events(events(), labels)
    assert p.peak_bytes == 190 and p.peak_time == 6 and p.peak_step == 1
    assert p.at_peak["category"] == {"parameters": 100, "activations": 50, "gradients": 40,
                                     "temporaries": 0, "comm": 0, "optimizer_state": 0}
    assert p.at_peak["module"] == {None: 100, "M.a": 90}
    assert p.at_peak["phase"] == {None: 100, "forward": 50, "backward": 40}
    assert p.at_peak["site"] == [(None, 100), ("train.py:10", 50), ("train.py:12", 40)]
    assert p.category_peaks == {"temporaries": 30, "comm": 0, "activations": 50,
                                "optimizer_state": 0, "gradients": 40, "parameters": 100}
    assert p.step_peaks == {0: 180, 1: 190}
    assert p.storages == 4
    times, grads = p.series("gradients")
    assert times.tolist() == sorted(times.tolist())
    assert p.total.tolist() == [100, 150, 150, 180, 180, 150, 190, 140, 140]
    assert grads.tolist()[-3:] == [40, 40, 40]
    assert p.total[-1] == 140            # s0 and s3 never freed: live to the end


def test_reclass_takes_the_storage_whole_life_and_ties_keep_file_order():
    # the same storage freed at the time another is allocated: file order decides
    rows = [(A, 0, 10, 1, TEMP, 0, -1), (F, 0, 10, 2, TEMP, 0, -1),
            (A, 1, 20, 2, TEMP, 0, -1), (R, 1, 20, 3, PARAM, 0, -1)]
    p = profile_events(events(rows))
    assert p.peak_bytes == 20 and p.peak_time == 2
    assert p.category_peaks["parameters"] == 20 and p.category_peaks["temporaries"] == 10
    assert p.at_peak["module"] == {None: 20}


def test_no_events():
    p = profile_events(MemoryEvents(*[np.zeros(0, np.int64)] * 8))
    assert p.peak_bytes == 0 and p.peak_time is None and p.storages == 0


def test_memory_rows_round_trip_through_the_format(tmp_path):
    path = str(tmp_path / "rank-0.arrow")
    dictionaries = {"op": ["aten.mm.default", "aten.add.Tensor"], "module": ["M.a", "M.b"],
                    "stack": [], "fwd_stack": [], "annotation": [], "shapes": [], "kind": [],
                    "group": [], "dtype": []}
    writer = TraceWriter(path, {"rank": 0, "world_size": 1}, memory=True)
    writer.write_columns({"t0": [10, 20], "t1": [15, 25], "op": [0, 1], "phase": [1, 2],
                          "module": [0, 1], "step": [0, 0], "thread": [0, 0]}, dictionaries)
    writer.write_arrays({"mem_kind": pa.array([A, A, F], pa.int8()),
                         "mem_storage": pa.array([0, 1, 0], pa.int32()),
                         "bytes": pa.array([64, 32, 64], pa.int64()),
                         "t0": pa.array([10, 20, 30], pa.int64()),
                         "mem_category": pa.array([TEMP, ACT, TEMP], pa.int8()),
                         "thread": pa.array([0, 0, None], pa.int16()),
                         "step": pa.array([0, 0, 0], pa.int32())}, 3, dictionaries)
    writer.close()
    with pa.OSFile(path) as fh:
        assert pa.ipc.open_stream(fh).schema.metadata[b"paratrace.version"] == b"4"
    trace = tracer.load(path)
    assert len(trace) == 2 and [r["op"] for r in trace.records()] == ["aten.mm.default",
                                                                     "aten.add.Tensor"]
    assert trace.memory.row.tolist() == [0, 1, -1]
    assert trace.memory.thread.tolist() == [0, 0, -1]
    p = memory_profile(trace)
    assert p.peak_bytes == 96 and p.at_peak["module"] == {"M.a": 64, "M.b": 32}
    assert p.at_peak["phase"] == {"forward": 64, "backward": 32}
    assert trace.select(np.array([True, False])).memory is None


def test_a_trace_without_memory_columns_reads_as_no_memory(tmp_path):
    path = str(tmp_path / "rank-0.arrow")
    writer = TraceWriter(path, {"rank": 0, "world_size": 1})
    writer.write([], {n: [] for n in ("op", "module", "stack", "fwd_stack", "annotation",
                                      "shapes", "kind", "group", "dtype")})
    writer.close()
    with pa.OSFile(path) as fh:
        schema = pa.ipc.open_stream(fh).schema
    assert schema.metadata[b"paratrace.version"] == b"3" and "mem_kind" not in schema.names
    trace = tracer.load(path)
    assert trace.memory is None and memory_profile(trace) is None


def test_the_drawn_lane_keeps_the_peak_and_moves_to_rank_0s_clock():
    from viz.analysis.memory.live_bytes import MAX_CORNERS, live_memory
    # 3 * MAX_CORNERS temporaries of 1..n bytes, each freed at once; one of 10**6 in the
    # middle: the lane has at most MAX_CORNERS corners and still its peak
    n, rows = 3 * MAX_CORNERS, []
    for i in range(n):
        size = 10 ** 6 if i == n // 2 else i + 1
        rows += [(A, i, size, 2 * i, TEMP, 0, -1), (F, i, size, 2 * i + 1, TEMP, 0, -1)]
    profile = profile_events(events(rows))
    lane = live_memory(profile, lambda t: np.full(len(t), 1000))
    assert len(lane.times) <= MAX_CORNERS + 2 and lane.times[-1] == profile.times[-1] + 1000
    assert int(lane.live.sum(axis=1).max()) == profile.peak_bytes == 10 ** 6
    assert (np.diff(lane.times) > 0).all() and lane.times[0] == profile.times[0] + 1000
    assert live_memory(None, lambda t: t) is None
