"""A user's torch.profiler profile as it would be without the recording mode (torch-free).

Any TorchDispatchMode doubles a profile (pytorch#195746, closed as expected behaviour): the op
the user called is recorded by the dispatcher (``Y``); torch's Python fallback then records a
``PythonDispatchMode`` range (``P``) around the mode's ``__torch_dispatch__``, whose call of the
op goes through the dispatcher again and is recorded a second time (``X``), holding the op's
own nested ops and launches. ``record_function``'s enter and exit are dispatched ops too, so
their ``P`` ranges cross the user's range (pytorch#191797).

While a user's profiler runs, the recording mode opens a range named :data:`MARK` around each
of its dispatches (``_mode.RecordingMode.mark_dispatch``), so its own events are told from those
of any other mode: per mark, the ``P`` right around it, the mark, the first op inside it named as
the op around ``P`` (``X``; whatever ``X`` launched is linked to ``Y`` instead) and the Python
frames of the dispatch (inside ``P``, outside ``X``) are left out. What the op did inside ``X``
stays, under ``Y``, as it is without the mode. Where the mode answered NotImplemented (it hands
a DTensor op to DTensor's own dispatch, under the mode: dtensor.py), a range named
:data:`PASSED` follows its mark, and the subclass's dispatch runs on inside ``P``: that ``P`` is
torch's ``PythonSubclass`` range without the mode, and is renamed so. A mark with no ``P``
around it is a call torch made to the mode itself: a plain tensor's shallow copy under any mode dispatches
``aten::detach`` (C++ alone without one: the whole mark goes), or a higher-order operator (the
ops it runs stay).

:func:`own_events` finds them in any list of events; :func:`filter_chrome_trace` applies it to
an exported Chrome trace file (tracer.recorder.compat applies it to torch's result object).
"""
from __future__ import annotations

import json
import re
from bisect import bisect_left
from typing import NamedTuple, Optional

MARK = "paratrace::dispatch"           # the recording mode's range around each of its dispatches
PASSED = "paratrace::passed"           # after a mark where the mode answered NotImplemented
PYTHON_DISPATCH = "PythonDispatchMode"  # torch's range around a mode's __torch_dispatch__
PYTHON_SUBCLASS = "PythonSubclass"      # torch's range around a subclass's __torch_dispatch__
DETACH = "aten::detach"
# a Python tracer event's name: "file.py(12): function" or "<built-in method ...>"
_PYTHON_NAME = re.compile(r"^(<built-in |.*\(\d+\): )")


class Event(NamedTuple):
    """What the filter reads of one event: where it ran (a host thread, a device stream), when,
    its name, whether it is a Python frame, its correlation id and the id it is linked to."""
    lane: tuple
    start: float
    end: float
    name: str
    python: bool
    corr: int
    linked: int


class Own(NamedTuple):
    """The events the recording mode made (indices into the list given), for each op record
    left out the correlation id its launches are linked to instead, and the events that are
    another's (index -> their name without the mode)."""
    dropped: set[int]
    relink: dict[int, int]
    renamed: dict[int, str]


def python_name(name: str) -> bool:
    """Whether ``name`` is a Python tracer event's (for torch versions whose events do not say
    so themselves)."""
    return bool(_PYTHON_NAME.match(name))


def _nesting(events: list[Event], take) -> tuple[dict, dict]:
    """(parent, children) of the events ``take`` accepts, by time on each lane: an event's parent
    is the innermost earlier event that holds it whole (ranges that cross are nobody's)."""
    order = sorted((i for i, e in enumerate(events) if take(e)),
                   key=lambda i: (events[i].lane, events[i].start, -events[i].end, i))
    parent: dict[int, int] = {}
    children: dict[int, list[int]] = {}
    stack: list[int] = []
    lane = None
    for i in order:
        e = events[i]
        if e.lane != lane:
            stack, lane = [], e.lane
        while stack and events[stack[-1]].end <= e.start:
            stack.pop()
        for j in reversed(stack):
            if events[j].end >= e.end:
                parent[i] = j
                children.setdefault(j, []).append(i)
                break
        stack.append(i)
    return parent, children


def _subtree(children: dict, top: int) -> set[int]:
    found, todo = set(), [top]
    while todo:
        i = todo.pop()
        found.add(i)
        todo.extend(children.get(i, ()))
    return found


def _redispatch(events: list[Event], parent: dict, children: dict, m: int,
                p: int) -> Optional[tuple[int, int]]:
    """(X, Y) for the mark ``m`` inside ``P``: X is the first op record inside the mark named as
    an op around P, Y the nearest such op (between them, torch's autograd kernels may record
    ranges of their own: ``aten::detach`` > ``detach`` > P)."""
    above: dict[str, int] = {}
    a = parent.get(p)
    while a is not None:
        above.setdefault(events[a].name, a)
        a = parent.get(a)
    for c in children.get(m, ()):
        if events[c].name in above:
            return c, above[events[c].name]
    return None


def own_events(events: list[Event]) -> Own:
    """The events of ``events`` that the recording mode's dispatches made (module docstring)."""
    marks = [i for i, e in enumerate(events) if e.name == MARK and not e.python]
    if not marks:
        return Own(set(), {}, {})
    parent, children = _nesting(events, lambda e: not e.python)
    passed = [i for i, e in enumerate(events) if e.name == PASSED and not e.python]
    dropped: set[int] = set(passed)
    # the mode answered NotImplemented: the subclass's dispatch ran on in the same fallback
    # call, which torch records as PythonSubclass without a mode
    renamed = {parent[q]: PYTHON_SUBCLASS for q in passed
               if q in parent and events[parent[q]].name == PYTHON_DISPATCH}
    relink: dict[int, int] = {}
    spans: list[tuple[int, Optional[int]]] = []      # (outermost dropped range, kept inside)
    for m in marks:
        dropped.add(m)
        p = parent.get(m)
        if p in renamed:
            spans.append((m, None))
            continue
        if p is None or events[p].name != PYTHON_DISPATCH:
            # torch called the mode itself: a plain tensor's shallow copy under a mode is
            # aten::detach dispatched to it (C++ alone without one); or a higher-order operator
            first = children.get(m, [None])[0]
            if first is not None and events[first].name == DETACH:
                dropped |= _subtree(children, m)
            spans.append((m, None))
            continue
        dropped.add(p)
        found = _redispatch(events, parent, children, m, p)
        if found is not None:
            dropped.add(found[0])
            relink[events[found[0]].corr] = events[found[1]].corr
        spans.append((p, found[0] if found is not None else None))
    dropped |= _dispatch_frames(events, spans)
    return Own(dropped, relink, renamed)


def _dispatch_frames(events: list[Event], spans: list[tuple[int, Optional[int]]]) -> set[int]:
    """The Python frames inside each dropped range but outside the op record kept inside it:
    the modes' dispatch code, which the profile would not hold without them; for a mark torch
    called directly (no PythonDispatchMode around it), the mode's own frame around it too."""
    if not any(e.python for e in events):
        return set()
    frames = sorted((e.lane, e.start, i) for i, e in enumerate(events) if e.python)
    found: set[int] = set()
    for outer, inner in spans:
        o = events[outer]
        k = bisect_left(frames, (o.lane, o.start, -1))
        if o.name == MARK:
            for j in range(k - 1, max(k - 64, 0) - 1, -1):
                f = events[frames[j][2]]
                if frames[j][0] != o.lane:
                    break
                if f.end >= o.end:
                    found.add(frames[j][2])
                    break
        while k < len(frames) and frames[k][0] == o.lane and frames[k][1] <= o.end:
            f = events[frames[k][2]]
            inside = inner is not None and events[inner].start <= f.start and \
                f.end <= events[inner].end
            if f.end <= o.end and not inside:
                found.add(frames[k][2])
            k += 1
    return found


def _chrome_event(raw: dict) -> Optional[Event]:
    if raw.get("ph") != "X" or "ts" not in raw:
        return None
    args = raw.get("args") or {}
    start = float(raw["ts"])
    lane = (str(raw.get("pid")), str(raw.get("tid")))
    return Event(lane, start, start + float(raw.get("dur", 0)),
                 str(raw.get("name", "")), raw.get("cat") == "python_function",
                 args.get("External id", 0) if isinstance(args, dict) else 0, 0)


def filter_chrome_trace(path: str) -> int:
    """Rewrite the Chrome trace torch.profiler exported at ``path`` without the recording
    mode's events (launches linked to the op the user called); returns how many events were
    left out. A file without a mark is left as it was."""
    with open(path, "rb") as f:
        raw = f.read()
    if MARK.encode() not in raw:
        return 0
    try:
        doc = json.loads(raw)
    except ValueError:      # not JSON torch can read back either: left as torch wrote it
        return 0
    trace = doc.get("traceEvents") or []
    present = [(i, _chrome_event(e)) for i, e in enumerate(trace) if isinstance(e, dict)]
    present = [(i, v) for i, v in present if v is not None]
    own = own_events([v for _, v in present])
    if not own.dropped and not own.renamed:
        return 0
    dropped = {present[k][0] for k in own.dropped}
    for k, name in own.renamed.items():
        trace[present[k][0]]["name"] = name
    for i, e in enumerate(trace):
        args = e.get("args") if isinstance(e, dict) and i not in dropped else None
        if isinstance(args, dict) and args.get("External id") in own.relink:
            args["External id"] = own.relink[args["External id"]]
    doc["traceEvents"] = [e for i, e in enumerate(trace) if i not in dropped]
    with open(path, "w") as f:
        json.dump(doc, f)
    return len(dropped)
