"""summary.json of a run, without the report: for a GPU machine with no graphviz (gpu_checks.sh).
Prints per rank the device activities attributed (and how) and the device time a counted step,
and its trace's ``device_time`` (the source, the CUPTI version driven, rows lost, records dropped,
buffers left to another profiler, the first error) and ``recorder_error`` if any.

    python3 scripts/gpu_summary.py RUN_DIR
"""
from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import tracer  # noqa: E402
from tracer.files import rundir  # noqa: E402
from viz.analysis import analyse  # noqa: E402
from viz.engine import Engine  # noqa: E402
from viz.render.report import ReportInput, summary_json  # noqa: E402
from viz.run import RunError, open_run  # noqa: E402


def main(run_dir: str) -> int:
    try:
        run = open_run(run_dir)
    except RunError as exc:
        print(f"gpu_summary.py: {exc}", file=sys.stderr)
        return 1
    with Engine(1, None) as engine:
        analysis = analyse(run, engine, {})
    (path,) = summary_json.render(ReportInput(analysis), run_dir)
    with open(path) as fh:
        summary = json.load(fh)
    for rank, entry in sorted(summary["ranks"].items(), key=lambda kv: int(kv[0])):
        device, time = entry.get("device"), entry.get("time", {})
        if device is None:
            print(f"rank {rank}: {entry['status']}, no device activity")
            continue
        steps = len(time.get("counted_steps") or []) or 1    # summary.json's time: sums
        print(f"rank {rank}: {entry['status']}, {device['attributed']:,} of "
              f"{device['activities']:,} activities attributed "
              f"{json.dumps(device.get('attributed_by', {}))}; clock {time.get('clock')}, "
              f"over {steps} counted steps: compute {time.get('compute_s', 0) * 1e3 / steps:.1f} "
              f"ms, wall {time.get('wall_s', 0) * 1e3 / steps:.1f} ms a step; "
              f"device busy {device['busy_s'] * 1e3:.1f} ms in all")
    for rank in sorted(int(r) for r in summary["ranks"]):
        path = rundir.trace_file(os.path.join(run_dir, "traces"), rank)
        if os.path.exists(path):
            meta = tracer.load(path).meta
            print(f"rank {rank}: device_time {json.dumps(meta.get('device_time'))}"
                  + (f"; recorder_error {json.dumps(meta['recorder_error'])}"
                     if meta.get("recorder_error") else ""))
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python3 scripts/gpu_summary.py RUN_DIR", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1]))
