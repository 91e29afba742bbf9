"""What Perfetto and chrome://tracing need of a Chrome trace (the timeline's ``timeline.json``),
checked on constructed and on real runs, against the Trace Event Format (its complete ``X``,
flow ``s``/``t``/``f``, counter ``C`` and metadata ``M`` events)."""
from __future__ import annotations

from collections import Counter

OP_ARGS = {"module", "phase", "source", "function", "shapes", "step"}


def check_chrome_trace(events, expected_flows):
    """Structure Perfetto and chrome://tracing need: named processes, complete events that nest
    on each thread, and every flow one start and one finish (steps between them allowed), each
    bound to a slice, the start and the finish on different ranks."""
    slices: dict = {}
    for e in events:
        assert {"ph", "pid", "name"} <= set(e)
        if e["ph"] == "X":
            assert e["dur"] >= 0
            slices.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for key, spans in slices.items():
        stack = []
        for start, end in sorted(spans, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1] <= start:
                stack.pop()
            assert not stack or end <= stack[-1] + 1e-6, f"overlapping slices on {key}"
            stack.append(end)
    flows = [e for e in events if e["ph"] in ("s", "t", "f")]
    per_id = Counter((e["id"], e["ph"]) for e in flows if e["ph"] != "t")
    assert all(n == 1 for n in per_id.values()), [k for k, n in per_id.items() if n > 1]
    starts = {e["id"]: e for e in flows if e["ph"] == "s"}
    finishes = {e["id"]: e for e in flows if e["ph"] == "f"}
    assert len(starts) == len(finishes) == expected_flows
    assert set(starts) == set(finishes)
    for e in flows:
        assert e["id"] in starts, f"flow step {e} without a start"
        assert any(a <= e["ts"] <= b for a, b in slices[(e["pid"], e["tid"])])
        # one flow is one thing: a step and its finish carry the start's name and category
        assert (e["name"], e["cat"]) == (starts[e["id"]]["name"], starts[e["id"]]["cat"])
        if e["ph"] != "s":
            assert e["bp"] == "e"             # bound to the slice that encloses it
    for flow_id, s in starts.items():
        assert s["pid"] != finishes[flow_id]["pid"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names == {pid: f"rank {pid}" for pid, _ in slices}


def check_op_args(events) -> list:
    """Every op slice (``cat`` compute) carries its args: module, phase, source line and
    function, input shapes, step. Returns the op slices."""
    ops = [e for e in events if e["ph"] == "X" and e.get("cat") == "compute"]
    assert ops
    for e in ops:
        assert set(e.get("args") or {}) == OP_ARGS, e
    return ops


def check_counters(events, name: str = "memory") -> dict:
    """Counter events of track ``name``: on a named process, at a time, each argument a
    number (a series of the track). Returns pid -> its events in time order."""
    out: dict = {}
    for e in events:
        if e["ph"] == "C" and e["name"] == name:
            assert isinstance(e["ts"], (int, float)) and e["args"]
            assert all(isinstance(v, (int, float)) for v in e["args"].values()), e
            out.setdefault(e["pid"], []).append(e)
    return {pid: sorted(es, key=lambda e: e["ts"]) for pid, es in out.items()}
