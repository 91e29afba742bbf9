"""GPU activity as CUPTI records it, read from torch.profiler's Chrome-trace export (Kineto).

Both paths of device time go through here: the recorder saves each recorded window's CUPTI activity
with torch's own Kineto binding and parses it back (tracer.recorder.device.kineto_windows), and
``trace-report --kineto FILE`` merges a user's own profiler export. The export is JSON: a
``traceEvents`` list whose ``ts``/``dur`` are microseconds (three decimals: nanoseconds). Newer
torch writes ``ts`` relative to ``baseTimeNanoseconds``; older torch writes no base and absolute
Unix microseconds. GPU work has categories ``kernel``, ``gpu_memcpy`` and ``gpu_memset`` (args:
device, stream, correlation, bytes); each was launched by a ``cuda_runtime`` or ``cuda_driver`` call
on a host thread (``tid``) with the same correlation.

Torch-free and pure: the export is read as a stream (:mod:`tracer.kineto.stream`, exact
integer nanoseconds, never a float64), into :class:`DeviceRecords` (numpy columns). JSON never
runs code, so a profile from someone else is safe to read.
"""
from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Any, Optional

from tracer.files.device_format import DeviceRecords, KINDS, empty

from .events import ExportEvents, collect
from .stream import ExactNumber, ExportStream, KinetoError

__all__ = ["ACTIVITY_KINDS", "DeviceRecords", "KINDS", "KinetoError", "empty", "export_head",
           "load_chrome_trace", "rank_of_export", "time_base"]

ACTIVITY_KINDS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
# Unix ns from 1973 on: an export's times are absolute already (torch before 2.1, no base)
ABSOLUTE_FROM_NS = 10 ** 17


def export_head(path: str) -> dict[str, Any]:
    """The top-level fields an export writes before its events (torch writes
    ``distributedInfo`` there), read without reading the events. Raises KinetoError for a
    file that is not an export at all."""
    stream = ExportStream(path)
    events = stream.events()
    try:
        next(events, None)
    finally:
        events.close()
    return stream.top


def rank_of(top: dict[str, Any]) -> Optional[int]:
    """``distributedInfo.rank`` when it is a whole number >= 0."""
    info = top.get("distributedInfo")
    rank = info.get("rank") if isinstance(info, dict) else None
    return rank if type(rank) is int and 0 <= rank < 1 << 31 else None


def rank_of_export(path: str) -> Optional[int]:
    """``distributedInfo.rank`` of an export, from its head, or None."""
    try:
        return rank_of(export_head(path))
    except KinetoError:
        return None


def time_base(top: dict[str, Any], first_ns: Optional[int]) -> tuple[Optional[int], list[str]]:
    """(ns to add to the export's times for Unix ns or None when they cannot be placed,
    notes): ``baseTimeNanoseconds`` when it is a whole number; without one (torch before 2.1),
    0 when the times are absolute already (``first_ns``, the earliest, is past 1973), else
    None: relative times with nothing to place them."""
    notes: list[str] = []
    base = top.get("baseTimeNanoseconds")
    if type(base) is ExactNumber:                # 1.7e18 written as a float: exact if whole
        try:
            whole = Decimal(base)
            base = int(whole) if whole == whole.to_integral_value() else base
        except (InvalidOperation, ValueError, OverflowError):
            pass
    if type(base) is int and 0 <= base < 1 << 62:
        return base, notes
    if "baseTimeNanoseconds" in top:
        shown = base if isinstance(base, (int, ExactNumber)) else \
            "null" if base is None else repr(base)[:40]
        notes.append(f"baseTimeNanoseconds is {shown}, not a whole number of ns: ignored")
    if first_ns is None or first_ns >= ABSOLUTE_FROM_NS:
        return 0, notes
    return None, notes


def damage_notes(events: ExportEvents) -> list[str]:
    """What was wrong with an export, as parts of its one line: malformed top-level fields,
    events dropped by reason, why reading stopped."""
    top = events.top
    notes = [f"{key} is {type(top[key]).__name__}, not {want}: ignored"
             for key, want, kind in (("deviceProperties", "a list", list),
                                     ("distributedInfo", "an object", dict))
             if key in top and not isinstance(top[key], kind)]
    notes += [f"{n:,} event{'s' if n != 1 else ''} {why}"
              for why, n in sorted(events.dropped.items())]
    if events.problem:
        notes.append(events.problem)
    return notes


def kept_events(events: ExportEvents) -> int:
    """The export's events that were read and kept (the dropped ones left out)."""
    return events.items - sum(n for why, n in events.dropped.items()
                              if why.startswith("dropped"))


def damage_line(events: ExportEvents, notes: list[str]) -> Optional[str]:
    """The export's one line: what was wrong with it and what was kept; None if nothing."""
    notes = notes + damage_notes(events)
    if not notes:
        return None
    return f"{events.path}: {'; '.join(notes)}; its other {kept_events(events):,} events are used"


def device_records(events: ExportEvents, base: int) -> DeviceRecords:
    """The GPU activity and launches of a collected export, at Unix ns (``base`` added)."""
    cols = dict(events.device)
    cols["start"] = cols["start"] + base
    cols["end"] = cols["end"] + base
    return DeviceRecords(names=list(events.device_names), rank=rank_of(events.top),
                         meta={"source": events.path, "devices": _devices(events.top)}, **cols)


def load_chrome_trace(path: str, limit: Optional[int] = None) -> DeviceRecords:
    """The GPU activity of a torch.profiler export (``.json`` or ``.json.gz``) at Unix ns.
    What was wrong but could be read past is in ``meta["damage"]`` (a list of notes); a file
    that is no export, or whose times cannot be placed, raises KinetoError."""
    events = collect(ExportStream(path, limit), host=False)
    starts = events.device["start"]
    base, notes = time_base(events.top, int(starts.min()) if len(starts) else None)
    if base is None:
        raise KinetoError(f"{path}: its times are relative to the profiler's start and it has "
                          "no usable baseTimeNanoseconds: they cannot be placed on the "
                          "recording's clock (torch.profiler writes it from torch 2.1 on)")
    records = device_records(events, base)
    records.meta["damage"] = notes + damage_notes(events)
    records.meta["damage_line"] = damage_line(events, notes)
    return records


def _devices(top: dict[str, Any]) -> list[str]:
    props = top.get("deviceProperties")
    if not isinstance(props, list):
        return []
    return [str(p.get("name")) for p in props if isinstance(p, dict) and "name" in p]
