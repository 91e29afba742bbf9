"""The Perfetto export (viz.render.timeline_json, the report's timeline.json) on a constructed
run, against the Chrome trace event format (support.chrome_trace_checks): each op slice carries
its module, phase, source line, shapes and step; each collective matched across ranks is one
flow through its members' slices (start on the lowest rank, a step on each rank between,
finish on the highest), beside the P2P flows; no collective flows without matching."""
from __future__ import annotations

import json

import pytest

from support.chrome_trace_checks import check_chrome_trace, check_op_args
from support.constructed_timelines import analysed, synthetic
from viz.render import timeline_json

SITE = [("/src/train.py", 12, "forward", "Block.forward")]
BACKWARD_SITE = [("/src/train.py", 20, "step", "step")]


def three_ranks():
    """Each rank: a forward mm in Block.forward, an all-reduce over all three ranks, an
    all-gather over ranks 0 and 1 (rank 2 is not in it), a backward op."""
    out = []
    for rank in range(3):
        r = synthetic(rank, 3)
        r.op(0, 10, "aten.mm.default", phase="forward", stack=SITE, module="GPT.blocks.0",
             shapes="f32[4,8] f32[8,8]")
        r.comm("all_reduce", 10 + rank, 11 + rank, 20, group=(0, 1, 2), phase="grad_sync")
        if rank < 2:
            r.comm("all_gather", 21, 22, 25 + rank, group=(0, 1), phase="forward")
        r.op(30, 35, "aten.mul.Tensor", phase="backward", stack=BACKWARD_SITE,
             fwd_stack=SITE, module="GPT.blocks.0")
        out.append(r)
    return out


def test_ops_carry_their_args_and_collectives_are_flows(tmp_path):
    analysis = analysed(tmp_path, three_ranks())
    assert len(analysis.cross.matched) == 2
    events = json.loads(timeline_json.render(analysis.timeline,
                                             analysis.cross.matched))["traceEvents"]
    check_chrome_trace(events, expected_flows=2)
    ops = check_op_args(events)
    assert len(ops) == 6
    mm = [e["args"] for e in ops if e["name"] == "aten.mm.default"]
    assert mm == [{"module": "GPT.blocks.0", "phase": "forward", "source": "/src/train.py:12",
                   "function": "Block.forward", "shapes": "f32[4,8] f32[8,8]", "step": 0}] * 3
    # a backward op's source line is its forward's (docs/phases.md)
    mul = {e["args"]["source"] for e in ops if e["name"] == "aten.mul.Tensor"}
    assert mul == {"/src/train.py:12"}
    flows = sorted((e["name"], e["ph"], e["pid"]) for e in events
                   if e.get("cat") == "collective")
    assert flows == [("all_gather #0", "f", 1), ("all_gather #0", "s", 0),
                     ("all_reduce #0", "f", 2), ("all_reduce #0", "s", 0),
                     ("all_reduce #0", "t", 1)]
    # each end sits on its rank's comm slice where that rank saw the collective complete
    slices = {(e["pid"], e["name"]): e for e in events if e.get("cat") == "comm"}
    for e in events:
        if e.get("cat") == "collective" and e["name"].startswith("all_reduce"):
            comm = slices[(e["pid"], "all_reduce")]
            assert e["ts"] == pytest.approx(comm["ts"] + comm["dur"] - 0.001)
    # without the matching, no collective flow
    bare = json.loads(timeline_json.render(analysis.timeline))["traceEvents"]
    assert not [e for e in bare if e.get("cat") == "collective"]
