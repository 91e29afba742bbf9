"""What Perfetto and chrome://tracing need of a Chrome trace (the timeline's ``timeline.json``),
checked on constructed and on real runs."""
from __future__ import annotations


def check_chrome_trace(events, expected_flows):
    """Structure Perfetto and chrome://tracing need: named processes, complete events that nest
    on each thread, and every flow start bound to a slice with exactly one finish."""
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
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    finishes = {e["id"]: e for e in events if e["ph"] == "f"}
    assert len(starts) == len(finishes) == expected_flows
    for flow_id, s in starts.items():
        f = finishes[flow_id]
        for e in (s, f):
            assert any(a <= e["ts"] <= b for a, b in slices[(e["pid"], e["tid"])])
        assert s["pid"] != f["pid"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names == {pid: f"rank {pid}" for pid, _ in slices}
