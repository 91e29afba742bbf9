"""GPU activity as CUPTI records it, read from torch.profiler's Chrome-trace export (Kineto).

Both paths of device time go through here: the recorder saves each recorded window's CUPTI
activity with torch's own Kineto binding and parses it back (tracer.device), and
``trace-report --kineto FILE`` merges a user's own profiler export. The export is JSON: a
``traceEvents`` list whose ``ts``/``dur`` are microseconds; absolute Unix time in ns is
``baseTimeNanoseconds + ts * 1000``. GPU work has categories ``kernel``, ``gpu_memcpy`` and
``gpu_memset`` (args: device, stream, correlation, bytes); each was launched by a
``cuda_runtime`` or ``cuda_driver`` call on a host thread (``tid``) with the same correlation.

Torch-free and pure: JSON in, :class:`DeviceRecords` (numpy columns) out. JSON never runs
code, so a profile from someone else is safe to read.
"""
from __future__ import annotations

import gzip
import json
import os
import re
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

ACTIVITY_KINDS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
LAUNCH_KINDS = {"cuda_runtime": "runtime", "cuda_driver": "driver"}
KINDS = ("kernel", "memcpy", "memset", "runtime", "driver")


class KinetoError(Exception):
    """A file that is not a readable torch.profiler Chrome trace; one line naming it."""


@dataclass
class DeviceRecords:
    """GPU activities and the host calls that launched them, as numpy columns. Times are
    Unix nanoseconds; ``kind`` indexes :data:`KINDS`, ``name`` indexes ``names``."""

    kind: np.ndarray
    name: np.ndarray
    start: np.ndarray
    end: np.ndarray
    device: np.ndarray
    stream: np.ndarray
    corr: np.ndarray
    tid: np.ndarray
    nbytes: np.ndarray
    names: list
    rank: Optional[int] = None          # distributedInfo.rank of an export, if it says
    meta: dict = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.kind)

    @property
    def is_launch(self) -> np.ndarray:
        return self.kind >= KINDS.index("runtime")

    def concat(self, other: "DeviceRecords") -> "DeviceRecords":
        """Both sets of records, names re-coded into one list."""
        names = list(self.names)
        index = {n: i for i, n in enumerate(names)}
        recode = np.array([index.setdefault(n, len(index)) for n in other.names] or [0],
                          dtype=np.int64)
        names = sorted(index, key=index.get)
        cols = {f: np.concatenate([getattr(self, f), getattr(other, f)])
                for f in ("kind", "start", "end", "device", "stream", "corr", "tid", "nbytes")}
        return DeviceRecords(name=np.concatenate([self.name, recode[other.name]]), names=names,
                             rank=self.rank if self.rank is not None else other.rank,
                             meta={**other.meta, **self.meta}, **cols)


def empty() -> DeviceRecords:
    z = np.zeros(0, dtype=np.int64)
    return DeviceRecords(z, z, z, z, z, z, z, z, z, [])


def rank_of_export(path: str) -> Optional[int]:
    """``distributedInfo.rank`` of an export, read from its head (torch writes it before the
    events), or None."""
    opener = gzip.open if str(path).endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8", errors="replace") as fh:
            head = fh.read(1 << 16)
    except (OSError, EOFError):
        return None
    match = re.search(r'"distributedInfo"\s*:\s*\{[^}]*?"rank"\s*:\s*(\d+)', head)
    return int(match.group(1)) if match else None


def load_chrome_trace(path: str) -> DeviceRecords:
    """Read a torch.profiler Chrome-trace export (``.json`` or ``.json.gz``)."""
    try:
        opener = gzip.open if str(path).endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        raise KinetoError(f"{path}: no such file") from None
    except (OSError, ValueError, EOFError) as exc:
        raise KinetoError(f"{path}: not a torch.profiler Chrome trace "
                          f"({str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__})"
                          ) from None
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise KinetoError(f"{path}: not a torch.profiler Chrome trace (no traceEvents list)")
    if "baseTimeNanoseconds" not in data:
        raise KinetoError(f"{path}: the export has no baseTimeNanoseconds: its times cannot be "
                          "placed (torch.profiler writes it from torch 2.1 on)")
    return parse(data, os.path.basename(str(path)))


def parse(data: dict, source: str = "") -> DeviceRecords:
    """The device records of a Chrome-trace dict."""
    base = int(data["baseTimeNanoseconds"])
    rows, names, index = [], [], {}
    for e in data["traceEvents"]:
        cat = e.get("cat") if isinstance(e, dict) else None
        kind = ACTIVITY_KINDS.get(cat) or LAUNCH_KINDS.get(cat)
        if kind is None or e.get("ph") != "X":
            continue
        args = e.get("args") or {}
        corr = args.get("correlation")
        if corr is None:
            continue
        try:
            start = base + int(round(float(e["ts"]) * 1000))
            end = start + int(round(float(e.get("dur", 0)) * 1000))
        except (KeyError, TypeError, ValueError):
            continue
        name = str(e.get("name", ""))
        code = index.get(name)
        if code is None:
            code = index[name] = len(names)
            names.append(name)
        launch = kind in LAUNCH_KINDS.values()
        rows.append((KINDS.index(kind), code, start, end,
                     -1 if launch else _int(args.get("device"), -1),
                     -1 if launch else _int(args.get("stream"), -1), _int(corr, -1),
                     _int(e.get("tid"), -1) if launch else -1,
                     _int(args.get("bytes"), -1)))
    cols = np.array(rows, dtype=np.int64).reshape(-1, 9)
    info = data.get("distributedInfo") or {}
    rank = info.get("rank") if isinstance(info, dict) else None
    return DeviceRecords(*(cols[:, i] for i in range(9)), names=names,
                         rank=int(rank) if isinstance(rank, int) else None,
                         meta={"source": source,
                               "devices": [p.get("name") for p in data.get("deviceProperties")
                                           or [] if isinstance(p, dict)]})


def _int(value, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default
