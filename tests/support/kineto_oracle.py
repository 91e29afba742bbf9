"""An independent computation of summary.json's ``device.whole`` straight from a torch.profiler
export, for tests and benchmarks to hold paratrace's importer against.

Written apart from the importer and sharing nothing with it: the whole JSON is loaded with the
standard library (numbers with a fraction as ``Decimal``, so no float64 touches a time), every
complete event of a GPU category is an activity, and the unions are measured by sorting and
sweeping in plain Python. Definitions (docs/contract.md): activity = kernel, memcpy or memset;
busy = |union of all|; compute = |union of kernels without "nccl" in their name|; comm = |union of
kernels with it (any case)|; memory = |union of memcpys and memsets|; span = last end - first
start; idle = span - busy; overlap = |comm ∩ compute| / |comm| (None without comm).

    python3 tests/support/kineto_oracle.py EXPORT.json[.gz]     # prints the numbers as JSON
"""
from __future__ import annotations

import gzip
import json
import sys
from decimal import Decimal

KERNEL = ("kernel", "Kernel")
MEMCPY = ("gpu_memcpy", "Memcpy")
MEMSET = ("gpu_memset", "Memset")


def load(path: str) -> dict:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as fh:
        return json.load(fh, parse_float=Decimal)


def activities(export: dict) -> list:
    """(category, name, start ns, end ns) of every GPU activity; ns exact from the µs text."""
    out = []
    for e in export.get("traceEvents", []):
        if not isinstance(e, dict) or e.get("ph") != "X":
            continue
        cat = e.get("cat")
        if cat not in KERNEL + MEMCPY + MEMSET:
            continue
        start = int((Decimal(e["ts"]) * 1000).to_integral_value())
        dur = int((Decimal(e["dur"]) * 1000).to_integral_value())
        out.append((cat, str(e.get("name", "")), start, start + dur))
    return out


def merged(spans: list) -> list:
    """The union of [start, end) spans as disjoint sorted spans."""
    out = []
    for start, end in sorted(spans):
        if end <= start:
            continue
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return out


def total(spans: list) -> int:
    return sum(end - start for start, end in spans)


def overlap(a: list, b: list) -> int:
    """|a ∩ b| of two unions."""
    i = j = 0
    n = 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        n += max(0, hi - lo)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return n


def whole(export: dict) -> dict:
    acts = activities(export)
    kernels = [(s, e, "nccl" in n.lower()) for c, n, s, e in acts if c in KERNEL]
    memory = [(s, e) for c, _, s, e in acts if c in MEMCPY + MEMSET]
    compute = merged([(s, e) for s, e, nccl in kernels if not nccl])
    comm = merged([(s, e) for s, e, nccl in kernels if nccl])
    busy = total(merged([(s, e) for _, _, s, e in acts]))
    span = max(e for *_, e in acts) - min(s for _, _, s, _ in acts) if acts else 0
    return {"kernels": len(kernels), "memcpys": sum(c in MEMCPY for c, *_ in acts),
            "memsets": sum(c in MEMSET for c, *_ in acts),
            "comm_kernels": sum(nccl for *_, nccl in kernels),
            "span_s": span / 1e9, "busy_s": busy / 1e9, "compute_s": total(compute) / 1e9,
            "comm_s": total(comm) / 1e9, "memory_s": total(merged(memory)) / 1e9,
            "idle_s": (span - busy) / 1e9,
            "overlap_fraction": overlap(comm, compute) / total(comm) if comm else None}


if __name__ == "__main__":
    print(json.dumps(whole(load(sys.argv[1])), indent=1))
