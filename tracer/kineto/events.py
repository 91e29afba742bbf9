"""The events of a torch.profiler export, sorted into columns in one pass over the stream.

:func:`collect` reads an export (:mod:`tracer.kineto.stream`) once and keeps what paratrace
uses, as compact columns (``array``/numpy, strings interned), never the events themselves:

- GPU activity: kernels, memcpys and memsets (categories ``kernel``, ``gpu_memcpy``,
  ``gpu_memset``, and the legacy ``Kernel``, ``Memcpy``, ``Memset``), with device, stream,
  correlation id and bytes; and the host calls that launched them (``cuda_runtime``,
  ``cuda_driver``, legacy ``Runtime``), with thread and correlation id: a
  :class:`tracer.files.device_format.DeviceRecords`;
- host events (``cpu_op`` or the legacy ``Operator``, ``user_annotation``,
  ``python_function``), when asked: name, thread, time, input shapes, and the arguments of
  communication (``record_param_comms``, ``c10d::`` ops);
- the autograd engine's forward-to-backward flows (``fwdbwd``).

Times are exact integer nanoseconds from the export's ``ts``/``dur`` (microseconds, with up
to three decimals: ns resolution), relative to ``baseTimeNanoseconds`` when the export has
one. An event that cannot be timed (``ts`` missing, non-finite, not a number or out of range;
``dur`` missing, negative or not a number) is dropped and counted in ``dropped``.
"""
from __future__ import annotations

import re
from array import array
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from operator import itemgetter
from typing import Any, Callable, Optional, Union, overload

import numpy as np

from .stream import ExactNumber, ExportStream

ACTIVITY_CATS = {"kernel": 0, "Kernel": 0, "gpu_memcpy": 1, "Memcpy": 1, "gpu_memset": 2,
                 "Memset": 2}
LAUNCH_CATS = {"cuda_runtime": 3, "Runtime": 3, "cuda_driver": 4, "Driver": 4}
HOST_CATS = {"cpu_op": 0, "Operator": 0, "user_annotation": 1, "python_function": 2}
OP_NAME = re.compile(r"^[A-Za-z_]\w*::\w+(\.\w+)?$")       # an op: aten::mm, c10d::send
CPU_OP, ANNOTATION, PYTHON = 0, 1, 2
_INT64 = 1 << 63
_TIME_RANGE = 1 << 62
COMM_ARGS = ("Collective name", "dtype", "In msg nelems", "Out msg nelems", "Group size",
             "Global rank start", "Global rank stride", "Process Group Name",
             "Process Group Ranks", "Process Group Description", "Process Group ID", "Seq",
             "Concrete Inputs", "Input type", "Input Dims")
CPP_DTYPES = {"float": "f32", "double": "f64", "c10::Half": "f16", "c10::BFloat16": "bf16",
           "long int": "i64", "long": "i64", "int": "i32", "short": "i16", "signed char": "i8",
           "unsigned char": "u8", "bool": "b8", "c10::complex<float>": "c64",
           "c10::complex<double>": "c128", "c10::Float8_e4m3fn": "f8e4m3",
           "c10::Float8_e5m2": "f8e5m2"}


def ns_of(value: Any) -> Optional[int]:
    """Microseconds as JSON gave them (an int, or the text of a number with a fraction) ->
    integer nanoseconds, exactly; None for anything that is no finite time."""
    t = type(value)
    if t is ExactNumber:
        try:                     # the usual three decimals (ns resolution): digits moved
            ns = int(value[:-4] + value[-3:]) if value[-4] == "." else _decimal_ns(value)
        except (ValueError, IndexError):
            ns = _decimal_ns(value)                    # '1.5e3': an exponent after all
    elif t is int:
        ns = value * 1000
    else:
        return None                                    # a string, null, NaN, Infinity, bool
    return ns if ns is not None and -_TIME_RANGE < ns < _TIME_RANGE else None


def _decimal_ns(text: str) -> Optional[int]:
    try:
        return int(Decimal(text).scaleb(3).to_integral_value())
    except (InvalidOperation, ValueError, OverflowError):
        return None


@overload
def int64(value: Any, default: int = -1) -> int: ...
@overload
def int64(value: Any, default: None) -> Optional[int]: ...


def int64(value: Any, default: Optional[int] = -1) -> Optional[int]:
    """An int argument (device, stream, correlation, bytes) if it is one that fits int64."""
    return value if type(value) is int and -_INT64 <= value < _INT64 else default


class Interner:
    """Strings -> codes, in order of first appearance."""

    def __init__(self) -> None:
        self.codes: dict[str, int] = {}
        self.values: list[str] = []

    def __call__(self, value: str) -> int:
        code = self.codes.get(value)
        if code is None:
            code = self.codes[value] = len(self.values)
            self.values.append(value)
        return code


@dataclass
class HostEvents:
    """Host events as columns (times relative, ns); ``comm`` maps an event's index to the
    arguments communication needs; ``shapes`` codes index ``shape_texts`` (-1: none)."""

    cat: array[int] = field(default_factory=lambda: array("b"))
    name: array[int] = field(default_factory=lambda: array("i"))
    tid: array[int] = field(default_factory=lambda: array("q"))
    start: array[int] = field(default_factory=lambda: array("q"))
    dur: array[int] = field(default_factory=lambda: array("q"))
    shapes: array[int] = field(default_factory=lambda: array("i"))
    grad: array[int] = field(default_factory=lambda: array("b"))   # ran through autograd
    names: Interner = field(default_factory=Interner)
    shape_texts: Interner = field(default_factory=Interner)
    comm: dict[int, dict[str, Any]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.cat)


@dataclass
class Flows:
    """fwdbwd flow points: the forward op ('s') and backward node ('f') ends of each id."""

    id: array[int] = field(default_factory=lambda: array("q"))
    is_end: array[int] = field(default_factory=lambda: array("b"))
    tid: array[int] = field(default_factory=lambda: array("q"))
    ts: array[int] = field(default_factory=lambda: array("q"))


@dataclass
class ExportEvents:
    """What :func:`collect` kept of one export."""

    path: str
    top: dict[str, Any]         # the top-level fields other than traceEvents
    device: dict[str, np.ndarray]   # DeviceRecords columns (numpy), times relative
    device_names: list[str]
    host: Optional[HostEvents]
    flows: Flows
    dropped: dict[str, int]     # what was done and why -> events (dropped, or kept as read)
    problem: Optional[str]      # why reading stopped early (None: read whole)
    items: int                  # traceEvents items read
    bytes_read: int
    # the allocator's ``[memory]`` instant events (profile_memory=True), host collection only:
    # name -> int64 column (t relative ns, addr, bytes, device_type, device_id, tid)
    memory: dict[str, np.ndarray] = field(default_factory=dict)


def shapes_text(args: dict[str, Any]) -> Optional[str]:
    """``Input Dims`` and ``Input type`` of a cpu_op as paratrace writes shapes
    (``f32[16,32] f32[32]``; a tensor list bracketed), None without any tensor."""
    dims, types = args.get("Input Dims"), args.get("Input type")
    if type(dims) is not list or type(types) is not list:
        return None
    # an export repeats a few thousand signatures: their text is made once
    key = (str(dims), tuple(types) if all(type(t) is str for t in types) else str(types))
    try:
        return _SHAPES[key]
    except KeyError:
        pass
    text = _shapes_text(dims, types)
    if len(_SHAPES) < 100_000:
        _SHAPES[key] = text
    return text


# (Input Dims text, Input types) -> the shapes' text
_SHAPES: dict[tuple[str, Union[tuple[str, ...], str]], Optional[str]] = {}


def _shapes_text(dims: list[Any], types: list[Any]) -> Optional[str]:
    parts = []
    for d, t in zip(dims, types):
        if type(d) is not list or not d and t in ("", "Scalar", None):
            continue
        if d and type(d[0]) is list:                 # a tensor list: its tensors' shapes
            inner = [_tensor(x, "?") for x in d if type(x) is list]
            parts.append("[" + ",".join(inner) + "]")
        else:
            parts.append(_tensor(d, CPP_DTYPES.get(t, t.replace(" ", "_") if type(t) is str
                                                 else "?")))
    return " ".join(parts) or None


def _tensor(dims: list[Any], dtype: str) -> str:
    return f"{dtype or '?'}[{','.join(str(int64(x, 0)) for x in dims)}]"


def collect(stream: ExportStream, host: bool = True) -> ExportEvents:
    """One pass over ``stream`` (see the module docstring); ``host``: keep host events too
    (merging GPU time into a recording needs only the device's)."""
    dev = {k: array("q") for k in ("kind", "name", "start", "end", "device", "stream", "corr",
                                   "tid", "nbytes")}
    names = Interner()
    out = HostEvents() if host else None
    memory = {k: array("q") for k in MEMORY_FIELDS} if host else None
    flows = Flows()
    dropped: dict[str, int] = {}
    take = _taker(dev, names, out)
    why: Optional[str]
    for e in stream.events():
        if type(e) is not dict:
            why = "dropped (not an event object)"
            dropped[why] = dropped.get(why, 0) + 1
            continue
        ph = e.get("ph")
        if ph == "X":
            why = take(e)
            if why:                     # dropped, or kept as far as it could be read
                dropped[why] = dropped.get(why, 0) + 1
        elif ph == "i" and memory is not None and e.get("name") == "[memory]":
            _memory_point(e, memory)
        elif (ph == "s" or ph == "f") and e.get("cat") == "fwdbwd":
            t, i = ns_of(e.get("ts")), int64(e.get("id"), None)
            if t is not None and i is not None:
                flows.id.append(i)
                flows.is_end.append(ph == "f")
                flows.tid.append(int64(e.get("tid"), -1))
                flows.ts.append(t)
    cols = {k: np.frombuffer(v, dtype=np.int64) if len(v) else np.zeros(0, np.int64)
            for k, v in dev.items()}
    mem = {k: np.frombuffer(v, dtype=np.int64) if len(v) else np.zeros(0, np.int64)
           for k, v in (memory or {}).items()}
    return ExportEvents(stream.path, stream.top, cols, names.values, out, flows, dropped,
                        stream.problem, stream.items, stream.bytes_read, mem)


# "total": the allocator's "Total Allocated" after the event (-1 where the export has none):
# torch's own count, which holds what was allocated before the export began
MEMORY_FIELDS = ("t", "addr", "bytes", "device_type", "device_id", "tid", "total")


def _memory_point(e: dict[str, Any], memory: dict[str, array[int]]) -> None:
    """One ``[memory]`` event (``Bytes`` > 0 an allocation at ``Addr``, < 0 its free); one
    that cannot be read whole is left out."""
    args = e.get("args")
    t = ns_of(e.get("ts"))
    if type(args) is not dict or t is None:
        return
    addr, nbytes = int64(args.get("Addr"), None), int64(args.get("Bytes"), None)
    if addr is None or nbytes is None:
        return
    values = (t, addr, nbytes, int64(args.get("Device Type"), -1),
              int64(args.get("Device Id"), -1), int64(e.get("tid"), -1),
              int64(args.get("Total Allocated"), -1))
    for name, value in zip(MEMORY_FIELDS, values):
        memory[name].append(value)


# Kineto writes a time before its base as ts 0 (and the duration then as 0): a device window
# saved after the next one was enabled has every CUPTI time so
# (tracer/recorder/device/kineto_windows.py)
_CLAMPED = "dropped (ts and dur 0: a time Kineto clamped to its base)"
_UNLINKED = "kept unlinked (device, stream or correlation not a whole number)"


# keeps one complete event: why it was dropped (or read only in part), else None
_Take = Callable[[dict[str, Any]], Optional[str]]
# keeps one host event: (event, category, start, duration, args)
_KeepHost = Callable[[dict[str, Any], int, int, int, dict[str, Any]], None]


def _taker(dev: dict[str, array[int]], names: Interner, out: Optional[HostEvents]) -> _Take:
    """The function that keeps one complete ('X') event and returns why it was dropped (or
    read only in part), else None. A closure over the columns' append methods: it runs once
    per event, and looking them up each time was a fifth of the reading time."""
    kind_, name_, start_, end_, device_, stream_, corr_, tid_, bytes_ = (
        dev[k].append for k in ("kind", "name", "start", "end", "device", "stream", "corr",
                                "tid", "nbytes"))
    activity, launch = ACTIVITY_CATS.get, LAUNCH_CATS.get
    fields = itemgetter("cat", "ts", "dur", "args")
    name_codes = names.codes
    no_host: dict[Any, int] = {}
    hostcat = (HOST_CATS if out is not None else no_host).get
    # without host events no category is a host one: keep_host is never called
    keep_host = _host_taker(out if out is not None else HostEvents())

    def take(e: dict[str, Any]) -> Optional[str]:
        try:                             # one C call for the fields every event has
            cat, ts, dur, args = fields(e)
        except KeyError:
            cat, ts, dur, args = e.get("cat"), e.get("ts"), e.get("dur"), e.get("args")
        kind = activity(cat)
        if kind is None:
            kind = launch(cat)
            if kind is None:
                kind = hostcat(cat)
                if kind is None:
                    return None
                kind = -1 - kind                      # host: -1 cpu_op, -2, -3
        start = ns_of(ts)
        if start is None:
            return "dropped (ts missing or not a finite number)"
        dur = ns_of(dur)
        if dur is None or dur < 0:
            return "dropped (dur missing, negative or not a number)"
        why = None
        if type(args) is not dict:
            why = None if args is None else "read with empty args (args not an object)"
            args = {}
        if kind < 0:
            keep_host(e, -1 - kind, start, dur, args)
            return why
        if start == 0 and dur == 0:
            return _CLAMPED
        kind_(kind)
        name = e.get("name", "")
        code = name_codes.get(name) if type(name) is str else None
        name_(code if code is not None else names(str(name)))
        start_(start)
        end_(start + dur)
        corr = args.get("correlation", -1)
        if type(corr) is not int or not -_INT64 <= corr < _INT64:
            corr, why = -1, why or _UNLINKED
        corr_(corr)
        if kind >= 3:                                    # a launch: on a host thread
            device_(-1)
            stream_(-1)
            tid_(int64(e.get("tid")))
            bytes_(-1)
            return why
        device, stream = args.get("device", -1), args.get("stream", -1)
        if type(device) is not int or type(stream) is not int or \
                not -_INT64 <= device < _INT64 or not -_INT64 <= stream < _INT64:
            device, stream, why = int64(device), int64(stream), why or _UNLINKED
        device_(device)
        stream_(stream)
        tid_(-1)
        bytes_(int64(args.get("bytes")))
        return why
    return take


def _host_taker(out: HostEvents) -> _KeepHost:
    """The function that keeps one host event (a closure, as :func:`_taker`). Shapes are
    made only for ops that may be a trace row: an op that starts strictly inside another op
    of its thread never is (tracer.kineto.host keeps the outermost), and torch writes each
    thread's ops in start order, so the op enclosing it came first."""
    cat_, name_, tid_, start_, dur_, shapes_, grad_ = (
        getattr(out, k).append for k in ("cat", "name", "tid", "start", "dur", "shapes",
                                         "grad"))
    codes, intern, shape_code, comm = out.names.codes, out.names, out.shape_texts, out.comm
    is_comm: list[bool] = []    # per name code: whether its arguments are a collective's
    is_op: list[bool] = []      # per name code: whether it names an op (ns::name)
    named_tids: dict[str, int] = {}
    # thread -> (start, end) of the last op that was no op's child
    outer: dict[int, tuple[int, int]] = {}

    def keep(e: dict[str, Any], cat: int, start: int, dur: int, args: dict[str, Any]) -> None:
        name = e.get("name")
        if type(name) is not str:
            name = str(name)
        code = codes.get(name)
        if code is None:
            code = intern(name)
            is_comm.append(name == "record_param_comms"
                           or name.startswith(("c10d::", "gloo:", "nccl:")))
            is_op.append(bool(OP_NAME.match(name)))
        cat_(cat)
        name_(code)
        tid = e.get("tid")
        if type(tid) is not int or not -_INT64 <= tid < _INT64:   # a name: a code below 0
            tid = -1 - named_tids.setdefault(str(tid), len(named_tids))
        tid_(tid)
        start_(start)
        dur_(dur)
        shapes = -1
        if cat == CPU_OP and is_op[code]:
            a, b = outer.get(tid, (0, 0))
            if not a < start < b:
                outer[tid] = (start, start + dur)
                if "Input Dims" in args:
                    text = shapes_text(args)
                    shapes = -1 if text is None else shape_code(text)
        shapes_(shapes)
        # torch records the autograd sequence number of an op that went through autograd
        # with grad mode on
        grad_("Sequence number" in args)
        if is_comm[code]:
            comm[len(out.cat) - 1] = {k: args[k] for k in COMM_ARGS if k in args}
    return keep
