"""An independent count of which recorded event launched each GPU activity of the H100 fixture
(tests/assets/gpu-h100), for tests/unit/test_device.py to hold viz.analysis.device.gpu_attribution's
attribution against.

Written apart from the importer and the attribution code, sharing nothing with them: the
profiler export is read with the standard library (every ``ts`` parsed as decimal text, so no
float64 touches a time), the trace with pyarrow alone, and every launch is compared with every
event by brute force in exact integers. The method is the fixture README's:

- host clocks: Unix ns = perf_counter ns + (``time_ns - perf_counter_ns``) of the start pair in
  clocks.json (read just before the recording);
- an activity's launch is the ``cuda_runtime`` / ``cuda_driver`` event with its correlation id;
- it is attributed *inside* the innermost recorded event (any op but ``paratrace::`` pseudo
  ops; the latest-started one) whose host interval holds the launch time, ends included. The
  interval is [t0, t1], but a collective's is [t0, t_ret]: a collective launches its work
  during its call, and t1 is its completion, absent when it was still in flight at the end;
- otherwise, before the first recorded event: process-group *setup* (NCCL communicator setup
  in init_process_group, which the fixture's trace predates an event for);
- otherwise, inside an annotation range (``paratrace::annotation``, [t0, t1]): *in the region*
  of the innermost (latest-started) one holding it, where a compiled region's fused kernels
  land (docs/gpu.md); none of the fixture's launches is;
- otherwise, before the last event's start: *between* events.

    python3 tests/support/attribution_oracle.py   # the counts and the launches that differ
                                            # under the README's first wording ([t0, t1] only)
"""
from __future__ import annotations

import bisect
import gzip
import json
import os
import sys
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
if __package__ in (None, ""):     # run as a script: tests/ importable, as under pytest
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from support.paths import GPU_FIXTURE  # noqa: E402

FIXTURE = GPU_FIXTURE
ACTIVITY = ("kernel", "gpu_memcpy", "gpu_memset")
LAUNCH = ("cuda_runtime", "cuda_driver")


def _ns(us) -> int:
    """Exact integer ns of a µs value parsed as Decimal (or an int)."""
    value = Decimal(us) * 1000
    assert value == value.to_integral_value(), f"{us} us is no whole number of ns"
    return int(value)


def launches(fixture: Path = FIXTURE) -> list:
    """(category, name, launch time on the host's perf_counter clock in ns) of every GPU
    activity of the export, in the export's order."""
    with gzip.open(fixture / "kineto.json.gz", "rt", encoding="utf-8") as fh:
        export = json.load(fh, parse_float=Decimal)
    base = int(export["baseTimeNanoseconds"])
    clocks = json.loads((fixture / "clocks.json").read_text())["start"]
    unix_minus_perf = clocks["time_ns"] - clocks["perf_counter_ns"]
    launched, activities = {}, []
    for e in export["traceEvents"]:
        if e.get("ph") != "X":
            continue
        if e.get("cat") in LAUNCH:
            launched[e["args"]["correlation"]] = base + _ns(e["ts"]) - unix_minus_perf
        elif e.get("cat") in ACTIVITY:
            activities.append((e["cat"], e["name"], e["args"]["correlation"]))
    return [(cat, name, launched[corr]) for cat, name, corr in activities]


def events(fixture: Path = FIXTURE) -> list:
    """(row, op, t0, t1, t_ret, is a collective) of every recorded event, pseudo ops left out;
    None where the trace has no value."""
    with pa.OSFile(str(fixture / "trace" / "rank-0.arrow")) as fh:
        table = pa.ipc.open_stream(fh).read_all()
    columns = [table.column(c).to_pylist() for c in ("op", "t0", "t1", "t_ret", "kind")]
    return [(row, op, t0, t1, t_ret, kind is not None)
            for row, (op, t0, t1, t_ret, kind) in enumerate(zip(*columns))
            if not op.startswith("paratrace::")]


def ranges(fixture: Path = FIXTURE) -> list:
    """(row, t0, t1) of every annotation range of the trace."""
    with pa.OSFile(str(fixture / "trace" / "rank-0.arrow")) as fh:
        table = pa.ipc.open_stream(fh).read_all()
    columns = [table.column(c).to_pylist() for c in ("op", "t0", "t1")]
    return [(row, t0, t1) for row, (op, t0, t1) in enumerate(zip(*columns))
            if op == "paratrace::annotation" and t1 is not None]


def attribute(acts: list, evs: list, collective_call: bool = True,
              regions: tuple = ()) -> list:
    """Per activity: ("inside", row) | ("setup", None) | ("region", row) | ("between", None)
    | (None, None), ``regions`` being :func:`ranges`. ``collective_call=False`` is the
    README's first wording: every event's [t0, t1]."""
    spans = [(t0, t_ret if collective and collective_call else t1, row)
             for row, _, t0, t1, t_ret, collective in evs]
    spans = [(t0, end, row) for t0, end, row in spans if end is not None]
    first = min(t0 for _, _, t0, *_ in evs)
    last = max(t0 for _, _, t0, *_ in evs)
    out = []
    for _, _, when in acts:
        holding = [(t0, row) for t0, end, row in spans if t0 <= when <= end]
        if holding:
            out.append(("inside", max(holding)[1]))    # the innermost: the latest started
        elif when < first:
            out.append(("setup", None))
        elif any(t0 <= when <= t1 for _, t0, t1 in regions):
            out.append(("region", max((t0, row) for row, t0, t1 in regions
                                      if t0 <= when <= t1)[1]))
        elif when < last:
            out.append(("between", None))
        else:
            out.append((None, None))
    return out


def counts(attributed: list) -> dict:
    out = {"inside_an_event": 0, "inside_a_region": 0, "process_group_setup": 0,
           "between_events": 0}
    names = {"inside": "inside_an_event", "region": "inside_a_region",
             "setup": "process_group_setup", "between": "between_events"}
    for how, _ in attributed:
        if how:
            out[names[how]] += 1
    return out


def closest_boundary_ns(acts: list, evs: list) -> int:
    """How near any launch comes to any event's t0 or end: a clock mapping that differs by
    less than this cannot move an attribution."""
    bounds = sorted({x for _, _, *times, _ in evs for x in times if x is not None})
    best = None
    for _, _, when in acts:
        i = bisect.bisect_left(bounds, when)
        for j in (i - 1, i):
            if 0 <= j < len(bounds):
                d = abs(when - bounds[j])
                best = d if best is None else min(best, d)
    return best


if __name__ == "__main__":
    acts, evs = launches(), events()
    now, readme = attribute(acts, evs, regions=ranges()), \
        attribute(acts, evs, collective_call=False)
    print("collective call [t0, t_ret]:", counts(now))
    print("every event [t0, t1]:       ", counts(readme))
    print("closest launch to an event boundary:", closest_boundary_ns(acts, evs), "ns")
    ops = {row: op for row, op, *_ in evs}
    for (cat, name, when), a, b in zip(acts, now, readme):
        if a != b:
            print(f"  {cat} {name} launched at {when}: {b[0]} under [t0, t1], "
                  f"inside {ops[a[1]]} (row {a[1]}) under [t0, t_ret]")
