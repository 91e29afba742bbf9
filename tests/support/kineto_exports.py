"""Small torch.profiler exports written by hand, for the --kineto tests: each aten::mm op
launches one kernel, with known times."""
from __future__ import annotations

import gzip
import json
from pathlib import Path


BASE = 1_700_000_000_000_000_000


def export(kernels: int = 3, **top) -> dict:
    """A small export: ``kernels`` aten::mm ops, each launching one kernel."""
    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1,
               "tid": 1, "ts": 0.0, "dur": 1000.0, "args": {}}]
    for k in range(kernels):
        t = 10.0 + 100 * k
        events += [
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": t,
             "dur": 20.5, "args": {"Input Dims": [[4, 8], [8, 2]],
                                   "Input type": ["float", "float"]}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
             "ts": t + 1, "dur": 5.0, "args": {"correlation": 100 + k}},
            {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": t + 30,
             "dur": 40.25, "args": {"device": 0, "stream": 7, "correlation": 100 + k}}]
    return dict({"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": 1},
                 "deviceProperties": [{"name": "GPU"}], "traceEvents": events,
                 "baseTimeNanoseconds": BASE}, **top)


def write(path: Path, data, text: str = None) -> Path:
    text = json.dumps(data, indent=1) if text is None else text
    if path.suffix == ".gz":
        with gzip.open(path, "wt") as fh:
            fh.write(text)
    else:
        path.write_text(text)
    return path


def json_memory_peak(events: list) -> int:
    """Live bytes' largest total from an export's ``[memory]`` events alone, counted apart
    from paratrace: an allocation at ``Addr`` lives until the free at the same ``Addr``; a
    free of an address allocated before the export is left out."""
    points = sorted((e for e in events if e.get("name") == "[memory]"),
                    key=lambda e: float(e["ts"]))
    live, now, peak = {}, 0, 0
    for e in points:
        addr, nbytes = e["args"]["Addr"], e["args"]["Bytes"]
        if nbytes > 0:
            live[addr], now = nbytes, now + nbytes
        elif addr in live:
            now -= live.pop(addr)
        peak = max(peak, now)
    return peak
