"""The aggregate every analysis reads: one rank's events grouped by where they came from.

A run has millions of events but only thousands of distinct (stack, forward stack, op, phase,
shapes, module) combinations. :func:`group_ops` aggregates them with numpy over the trace's
integer codes into :class:`OpGroup` s, each carrying its *attribution path*: the user frames,
outermost first, of the forward stack that created the autograd node for a backward op (so the
backward all-reduce of the column-parallel ``f`` lands on the column-parallel forward line),
else of the live stack. Library frames are collapsed to the *boundary* call. Call graphs, the
module view, source pages and diffs are all built from these groups.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterable, NamedTuple, Optional, Protocol, Sequence, overload

import numpy as np

from tracer.files.format import decode_stack
from tracer.files.reader import Trace
from tracer.vocab.labels import PHASES
from tracer.vocab.library import LibraryRule
from tracer.vocab.ops import PSEUDO_OPS

from .flops import flops as op_flops
from .source_files import is_library

# Records made by the hundred thousand (op groups of many ranks; a 64-rank run holds ~0.5M
# CommSpans and Passes, viz.analysis.timeline.lanes): slots save their per-instance dict. Python
# 3.11+ only, where frozen slotted dataclasses pickle (worker processes and Dask send them back).
SLOTS = {"slots": True} if sys.version_info >= (3, 11) else {}
MEASURES = ("ops", "time_ns", "bytes")
VIA_FRAMES = 2   # frames of a backward op's live stack kept to say which backward code ran it


class Frame(NamedTuple):
    """One recorded frame: where execution was (``line``) in which function. A NamedTuple:
    frames are hashed millions of times while graphs are built, and tuples hash in C."""

    file: str
    line: int
    function: str
    qualname: str


NO_STACK = Frame("?", 0, "?", "(no stack recorded)")
Path = tuple[Frame, ...]                      # an attribution path, outermost first
Split = tuple[Path, Optional[Frame]]          # (user frames, the library call they made)


@dataclass(**SLOTS)
class Weights:
    """What a node, edge or line accounts for. Slotted: a merged call graph of many ranks holds
    one per node, edge, rank and direction (hundreds of thousands for 64 ranks)."""

    ops: int = 0          # events (aten ops, collectives); a range's kernels: launches
    time_ns: float = 0    # summed durations; a collective counts launch to completion
    bytes: int = 0        # bytes handed to collectives
    comms: int = 0        # collective / P2P calls
    flops: int = 0

    def add(self, other: "Weights") -> None:
        self.ops += other.ops
        self.time_ns += other.time_ns
        self.bytes += other.bytes
        self.comms += other.comms
        self.flops += other.flops

    def get(self, measure: str) -> float:
        return getattr(self, measure)


def total_of(weights: Iterable[Weights]) -> Weights:
    out = Weights()
    for w in weights:
        out.add(w)
    return out


@dataclass(frozen=True, **SLOTS)
class OpGroup:
    """Events of one rank sharing attribution path, op, phase, shapes and module. Slotted: the
    report holds about a thousand a rank, twice (every step, counted steps)."""

    rank: int
    path: Path                # Frames of user code, outermost first (never empty)
    boundary: Optional[Frame]  # the library function the innermost user frame called
    via: Optional[Path]       # backward ops: innermost user frames of the code that ran them
    op: str
    phase: str                # a name of tracer.vocab.labels.PHASES
    kind: Optional[str]       # communication kind, None for compute ops
    shapes: Optional[str]
    module: Optional[str]
    count: int
    time_ns: float
    bytes: int
    flops: int

    def weights(self) -> Weights:
        return Weights(self.count, self.time_ns, self.bytes, self.count if self.kind else 0,
                       self.flops)


def library_test(trace: Trace) -> Callable[[str], bool]:
    """Whether a recorded file is library code, as the recorder decided (the trace's library
    rule: by default torch and the standard library, so transformers' or Lightning's frames are
    the user's); by its path (site-packages, the stdlib) for traces recorded before the rule."""
    rule = LibraryRule.from_meta(trace.meta)
    return is_library if rule is None else rule.is_library


def split_stack(frames: Sequence[Sequence[Any]], library: Callable[[str], bool] = is_library
                ) -> Split:
    """Recorded frames (innermost first) -> (user frames outermost first, boundary frame).

    The boundary is the outermost frame of the innermost run of library frames: the library call
    the user's code made. Library frames between user frames (module call machinery) are
    dropped. A stack of library frames only keeps its outermost frame as the path. ``library``
    says which files are library (:func:`library_test` of the trace)."""
    user: list[Frame] = []
    boundary: Optional[Frame] = None
    for raw in frames:
        frame = Frame(raw[0], int(raw[1]), raw[2], raw[3])
        if library(frame.file):
            if not user:
                boundary = frame
            continue
        user.append(frame)
    if not user:
        return ((boundary,) if boundary else (NO_STACK,)), None
    return tuple(reversed(user)), boundary


def site_of(trace: Trace, stack: int, fwd_stack: int = -1) -> Optional[Frame]:
    """The innermost user frame an event is attributed to (the forward stack's for backward
    events), or None without a stack."""
    code = fwd_stack if fwd_stack >= 0 else stack
    if code < 0:
        return None
    path, _ = split_stack(trace.stack(code), library_test(trace))
    return None if path[-1] is NO_STACK else path[-1]


def _group_rows(columns: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Group rows by several int columns: (inverse index per row, first row of each group)."""
    key = np.zeros(len(columns[0]), dtype=np.int64)
    for col in columns:
        c = col.astype(np.int64) + 1                       # null (-1) -> 0
        span = int(c.max()) + 1 if len(c) else 1
        if (int(key.max()) + 1) * span >= 2 ** 62:         # keep the packed key in int64
            _, key = np.unique(key, return_inverse=True)
            key = key.astype(np.int64)
        key = key * span + c
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    return inverse.reshape(-1), first


def _splitter(trace: Trace, split_cache: Optional[dict[int, Split]]) -> Callable[[int], Split]:
    """Stack code -> its frames split (:func:`split_stack`), each decoded once into
    ``split_cache``."""
    cache: dict[int, Split] = {} if split_cache is None else split_cache
    library, texts = library_test(trace), trace.dictionary("stack")

    def split(code: int) -> Split:
        # NOTE: decodes from one copy of the dictionary; Trace.stack(code) copies the whole
        # dictionary on every call, quadratic over a run's thousands of stacks.
        if code not in cache:
            cache[code] = split_stack(decode_stack(texts[code]), library) \
                if code >= 0 else ((NO_STACK,), None)
        return cache[code]
    return split


def group_ops(trace: Trace, durations: Optional[np.ndarray] = None,
              split_cache: Optional[dict[int, Split]] = None) -> list[OpGroup]:
    """One rank's ops and collectives aggregated into :class:`OpGroup` s (pseudo-ops dropped).
    Each event weighs its host interval, or ``durations[row]`` when given (device time).
    ``split_cache`` (stack code -> its frames split) shares the frames between calls over the
    same stack dictionary: groups of several step ranges of a rank then hold one copy."""
    if len(trace) == 0:
        return []
    op_names = trace.dictionary("op")
    drop = np.array([name in PSEUDO_OPS for name in op_names] + [True])  # code -1 -> dropped
    rows = np.nonzero(~drop[trace.col("op")])[0]
    if len(rows) == 0:
        return []
    keys = ("stack", "fwd_stack", "op", "phase", "shapes", "module")
    cols = {name: trace.col(name)[rows] for name in keys}
    inverse, first = _group_rows([cols[name] for name in keys])
    if durations is not None:
        duration = np.asarray(durations)[rows].clip(min=0)
    else:
        t0, t1 = trace.col("t0")[rows], trace.col("t1")[rows]
        duration = np.where(t1 >= 0, t1 - t0, 0).clip(min=0)
    nbytes = trace.col("bytes")[rows].clip(min=0)
    counts = np.bincount(inverse)
    times = np.bincount(inverse, weights=duration)
    byte_sums = np.bincount(inverse, weights=nbytes)
    kinds = trace.col("kind")[rows][first]
    kind_names, shape_names = trace.dictionary("kind"), trace.dictionary("shapes")
    module_names = trace.dictionary("module")
    split = _splitter(trace, split_cache)
    out: list[OpGroup] = []
    via: Optional[Path]
    for g, row in enumerate(first.tolist()):
        stack, fwd = int(cols["stack"][row]), int(cols["fwd_stack"][row])
        live_path, live_boundary = split(stack)
        if fwd >= 0:
            path, boundary = split(fwd)
            via = live_path[-VIA_FRAMES:] if live_path[-1] is not NO_STACK else None
        else:
            path, boundary, via = live_path, live_boundary, None
        op = op_names[int(cols["op"][row])]
        shape_code, module_code = int(cols["shapes"][row]), int(cols["module"][row])
        shapes = shape_names[shape_code] if shape_code >= 0 else None
        count = int(counts[g])
        kind = kind_names[kinds[g]] if kinds[g] >= 0 else None
        out.append(OpGroup(
            rank=trace.rank, path=path, boundary=boundary, via=via, op=op,
            phase=PHASES[int(cols["phase"][row])], kind=kind, shapes=shapes,
            module=module_names[module_code] if module_code >= 0 else None, count=count,
            time_ns=float(times[g]), bytes=int(byte_sums[g]),
            flops=op_flops(op, shapes) * count))
    return out


class RegionSite(NamedTuple):
    """Where a range's own GPU work is shown: an attribution path, module and phase."""

    path: Path
    boundary: Optional[Frame]
    module: Optional[str]
    phase: str


class RegionKernels(Protocol):
    """GPU activities launched inside annotation ranges, outside their events
    (viz.analysis.device.gpu_attribution.RegionWork)."""

    @property
    def row(self) -> np.ndarray: ...            # the range's trace row
    @property
    def name(self) -> np.ndarray: ...           # a code into names
    @property
    def names(self) -> list[str]: ...
    @property
    def ns(self) -> np.ndarray: ...             # device time


def kernel_groups(trace: Trace, work: Optional[RegionKernels], keep: Optional[np.ndarray] = None,
                  split_cache: Optional[dict[int, Split]] = None) -> list[OpGroup]:
    """GPU work launched inside annotation ranges and none of their events
    (:meth:`viz.analysis.device.gpu_attribution.DeviceTime.in_regions`: a compiled region's fused
    kernels, a CUDA graph replayed, a Triton kernel called directly) as op groups named by
    kernel: a range's activities of one kernel name are one group (``count``: launches), under
    the range's site (:func:`region_sites`). ``keep``: which trace rows count (a step range)."""
    if work is None or not len(work.row):
        return []
    sel = np.ones(len(work.row), bool) if keep is None else np.asarray(keep)[work.row]
    if not sel.any():
        return []
    names, ns = work.name[sel], work.ns[sel]
    ranges, per = np.unique(work.row[sel], return_inverse=True)
    # ranges at one site (a compiled graph's calls) group together
    index: dict[RegionSite, int] = {}
    site_of = np.array([index.setdefault(x, len(index)) for x in
                        region_sites(trace, ranges.tolist(), split_cache)], dtype=np.int64)
    sites = list(index)
    site = site_of[per.reshape(-1)]
    inverse, first = _group_rows([site, names])
    counts, times = np.bincount(inverse), np.bincount(inverse, weights=ns)
    out: list[OpGroup] = []
    for g, i in enumerate(first.tolist()):
        where = sites[int(site[i])]
        out.append(OpGroup(rank=trace.rank, path=where.path, boundary=where.boundary,
                           via=None, op=work.names[int(names[i])], phase=where.phase,
                           kind=None, shapes=None, module=where.module, count=int(counts[g]),
                           time_ns=float(times[g]), bytes=0, flops=0))
    return out


def region_sites(trace: Trace, rows: list[int], split_cache: Optional[dict[int, Split]] = None
                 ) -> list[RegionSite]:
    """The :class:`RegionSite` of each range row (docs/gpu.md). Its path: the row's own stack
    (a higher-order operator's), else the call path its events (same thread) share
    (:func:`_shared_path`), cut at the compiled function a ``torch.compile`` range names
    (``code``), else that function's line. Its module: the row's, else the range's
    ``module`` attribute, else what its events' modules share. Its phase: the one most of its
    events have, else the range's ``pass``, else the row's."""
    split = _splitter(trace, split_cache)
    op, t0, t1 = trace.col("op"), trace.col("t0"), trace.col("t1")
    thread, stack, module = trace.col("thread"), trace.col("stack"), trace.col("module")
    phase, modules, notes = trace.col("phase"), trace.dictionary("module"), \
        trace.col("annotation")
    drop = np.array([name in PSEUDO_OPS for name in trace.dictionary("op")] + [True])
    real = np.nonzero(~drop[op])[0]
    real = real[np.argsort(t0[real], kind="stable")]
    per_thread = {int(k): real[thread[real] == k] for k in np.unique(thread[rows])}
    out: list[RegionSite] = []
    for r in rows:
        entry = (trace.annotation(int(notes[r])) or ({},))[-1]
        mine = per_thread[int(thread[r])]
        inner = mine[np.searchsorted(t0[mine], t0[r], side="left"):
                     np.searchsorted(t0[mine], t1[r], side="right")]
        if stack[r] >= 0:
            path, boundary = split(int(stack[r]))
        else:
            path, boundary = _shared_path([split(int(c)) for c in np.unique(stack[inner])
                                           if c >= 0], entry), None
        if module[r] >= 0:
            mod = modules[module[r]]
        elif isinstance(entry.get("module"), str) and entry["module"]:
            mod = entry["module"]
        else:
            mod = _shared_module({modules[m] if m >= 0 else None
                                  for m in module[inner].tolist()})
        if len(inner):
            name = PHASES[int(np.bincount(phase[inner]).argmax())]
        else:
            name = entry["pass"] if entry.get("pass") in PHASES else PHASES[int(phase[r])]
        out.append(RegionSite(path, boundary, mod, name))
    return out


def _shared_path(splits: list[Split], entry: dict[str, Any]) -> Path:
    """The frames the paths of ``splits`` ((path, boundary) of its events) share from the
    outermost, less the lines that issued an op themselves (no library call between: the
    range's own work is not on another op's line), up to the compiled function where the range
    names one (``code``: "file:line", ``fn``); that function alone when nothing is left;
    NO_STACK without either."""
    file, _, line = str(entry.get("code") or "").rpartition(":")
    fn = str(entry.get("fn") or "")

    def compiled(f: Frame) -> bool:
        return bool(file) and f.file == file and (str(f.line) == line or f.qualname == fn)
    paths = [path for path, _ in splits]
    shared: list[Frame] = []
    for frames in (zip(*paths) if paths else ()):
        if any(f != frames[0] for f in frames) or frames[0] is NO_STACK:
            break
        shared.append(frames[0])
    direct = {path[-1] for path, boundary in splits if boundary is None}
    while shared and shared[-1] in direct and not compiled(shared[-1]):
        shared.pop()
    cut = next((i for i, f in enumerate(shared) if compiled(f)), None)
    if cut is not None:
        return tuple(shared[:cut + 1])
    if shared:
        return tuple(shared)
    if file and line.isdigit():
        return (Frame(file, int(line), fn.rpartition(".")[2] or "?", fn or "?"),)
    return (NO_STACK,)


def _shared_module(names: set[Optional[str]]) -> Optional[str]:
    """The module path every name lies under (``GPT.blocks`` of ``GPT.blocks.0`` and
    ``GPT.blocks.1``); None when one has none, or there are none."""
    paths = [n for n in names if n is not None]
    if not paths or len(paths) < len(names):
        return None
    common = []
    for level in zip(*(n.split(".") for n in paths)):
        if any(x != level[0] for x in level):
            break
        common.append(level[0])
    return ".".join(common) or None


class SharedOpGroups:
    """One copy of equal frames, attribution paths and names across many ranks' op groups.

    Each rank's groups arrive from its task (unpickled from a worker) with copies of their own,
    though the ranks of a data-parallel group record the same call sites, paths, shapes and
    modules: :meth:`of` rebuilds a rank's groups on the copies seen first, so what a run's
    groups hold besides their counts grows with its distinct call sites, not with its ranks.
    Frames equal to :data:`NO_STACK` become NO_STACK itself (pickling loses its identity)."""

    def __init__(self) -> None:
        self._names: dict[str, str] = {}
        self._frames: dict[Frame, Frame] = {NO_STACK: NO_STACK}
        self._paths: dict[Path, Path] = {}

    @overload
    def _name(self, text: str) -> str: ...
    @overload
    def _name(self, text: None) -> None: ...

    def _name(self, text: Optional[str]) -> Optional[str]:
        return None if text is None else self._names.setdefault(text, text)

    @overload
    def _frame(self, frame: Frame) -> Frame: ...
    @overload
    def _frame(self, frame: None) -> None: ...

    def _frame(self, frame: Optional[Frame]) -> Optional[Frame]:
        if frame is None:
            return None
        shared = self._frames.get(frame)
        if shared is None:
            shared = self._frames[frame] = Frame(self._name(frame.file), frame.line,
                                                 self._name(frame.function),
                                                 self._name(frame.qualname))
        return shared

    @overload
    def _path(self, frames: Path) -> Path: ...
    @overload
    def _path(self, frames: None) -> None: ...

    def _path(self, frames: Optional[Path]) -> Optional[Path]:
        if frames is None:
            return None
        shared = self._paths.get(frames)
        if shared is None:
            shared = tuple(self._frame(f) for f in frames)
            self._paths[shared] = shared
        return shared

    def of(self, groups: list[OpGroup]) -> list[OpGroup]:
        """``groups`` with their frames, paths and names replaced by the shared copies."""
        name = self._name
        return [OpGroup(g.rank, self._path(g.path), self._frame(g.boundary), self._path(g.via),
                        name(g.op), name(g.phase), name(g.kind), name(g.shapes), name(g.module),
                        g.count, g.time_ns, g.bytes, g.flops) for g in groups]
