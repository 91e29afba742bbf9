"""Records as numpy columns (viz.analysis.timeline.columns): what goes in comes out, record for
record, whatever its fields hold (integers with Nones, booleans, strings, frames); slices, pickling,
and the column look-ups the analyses use."""
from __future__ import annotations

import pickle

import numpy as np
import pytest

from viz.analysis.callgraphs.op_groups import Frame
from viz.analysis.timeline.columns import Records
from viz.analysis.timeline.lanes import CommSpan, P2PLink, Pass, RankLanes

SITE = Frame("/work/train.py", 12, "step", "Trainer.step")


def spans() -> list:
    return [CommSpan(3, 10, "send", 1, 100, 150, 4, "3,4", 64, True, True, 0, "f32", SITE),
            CommSpan(3, 11, "all_reduce", 1, 120, 400, None, "0-7", 1 << 40, False, False,
                     None, None, None),
            CommSpan(3, 7, "recv", 2, 500, 501, 2, "2,3", 0, True, False, 5, "bf16", SITE)]


def test_records_give_back_what_went_in():
    records = Records(CommSpan, spans())
    assert len(records) == 3 and list(records) == spans() and records == spans()
    assert [records[i] for i in range(3)] == spans() and records[-1] == spans()[-1]
    with pytest.raises(IndexError):
        records[3]
    assert records[1].peer is None and records[1].seq is None and records[1].site is None
    assert records[0].site is SITE or records[0].site == SITE
    assert isinstance(records[0].start, int) and isinstance(records[0].completed, bool)
    assert records[1:] == spans()[1:] and records[np.array([2, 0])] == [spans()[2], spans()[0]]
    again = pickle.loads(pickle.dumps(records))
    assert again == spans() and again.tables == records.tables
    assert Records.of(CommSpan, records) is records
    assert list(Records(CommSpan, spans()[:1]) + spans()[1:]) == spans()


def test_columns_and_look_ups():
    records = Records(CommSpan, spans())
    assert records.column("start").tolist() == [100, 120, 500]
    assert records.column("peer").tolist() == [4, -1, 2]          # None reads as -1
    assert records.column("nbytes").dtype == np.int64 and records.column("nbytes")[1] == 1 << 40
    with pytest.raises(TypeError):
        records.column("kind")
    assert records.values("kind") == ["send", "all_reduce", "recv"]
    assert records.values("seq") == [0, None, 5]
    assert records.where("kind", "recv").tolist() == [2]
    assert records.where("kind", "broadcast").tolist() == []
    assert records.where("peer", None).tolist() == [1] and records.where("peer", 2).tolist() == [2]
    assert records.find("index", 7) == 2 and records.find("index", 11) == 1
    assert records.find("index", 8) == -1
    # a field's strings are held once, as codes
    assert records.tables["kind"] == ["send", "all_reduce", "recv"]
    assert records.columns["kind"].dtype == np.int32


def test_no_records():
    empty = Records(CommSpan, [])
    assert len(empty) == 0 and list(empty) == [] and empty == []
    assert empty.column("start").tolist() == [] and empty.where("kind", "send").tolist() == []
    assert empty.find("index", 0) == -1


def test_lanes_hold_their_records_as_columns():
    passes = [Pass(0, 1, "F", 0, 0, 10, 20, "annotation"), Pass(0, 1, "B", None, 0, 30, 50,
                                                                 "inferred")]
    lane = RankLanes(0, np.zeros((0, 2), np.int64), spans(), np.zeros((0, 2), np.int64), passes,
                     {}, frozenset(), *(np.zeros(0, np.int64),) * 4, [], 0, [], {}, (0,), None)
    assert isinstance(lane.comm, Records) and isinstance(lane.passes, Records)
    assert lane.passes == passes and lane.comm == spans()
    links = Records(P2PLink, [P2PLink(0, 1, 2, 3)])
    assert links.column("dst_index").tolist() == [3]
