"""The timeline's records: passes, communication spans, P2P links, each rank's lanes, the
timeline of all ranks. Plain data, built by :mod:`viz.analysis.timeline.assemble` (host clock) and
:mod:`viz.analysis.device.device_lanes` (device clock), read by the metrics and the renderers."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Protocol

import numpy as np

from tracer.vocab.labels import PassSource
from tracer.vocab.strenum import StrEnum

from ..callgraphs.op_groups import SLOTS, Frame
from .columns import Records


class Clock(StrEnum):
    """Whose clock a rank's lanes time: the host's (its ops) or the device's (their GPU work)."""

    HOST = "host"
    DEVICE = "device"


Annotation = tuple[int, int, str, int]     # a range that names no pass: start, end, label, depth


class MemoryLane(Protocol):
    """A rank's live bytes over time, to draw (viz.analysis.memory.live_bytes.LiveMemory: the
    memory room is built beside this one): ``live[i, c]``, bytes of ``categories[c]`` from
    ``times[i]`` on."""

    @property
    def times(self) -> np.ndarray: ...
    @property
    def live(self) -> np.ndarray: ...
    @property
    def categories(self) -> tuple[str, ...]: ...
    @property
    def peak_bytes(self) -> int: ...


@dataclass(frozen=True, **SLOTS)
class Pass:
    """One F, B or W pass of one micro-batch through one model chunk on one rank."""

    rank: int
    step: int
    kind: str                  # "F" | "B" | "W"
    microbatch: Optional[int]
    chunk: int                 # annotation: the rank's chunk; pipelining: the global stage
    start: int
    end: int
    source: PassSource


@dataclass(frozen=True, **SLOTS)
class CommSpan:
    """One collective or P2P operation: launch to (effective) completion."""

    rank: int
    index: int                 # row in the rank's trace
    kind: str
    step: int
    start: int
    end: int
    peer: Optional[int]
    group: str
    nbytes: int
    completed: bool            # False: never completed; ``end`` is the end of the recording
    capped: bool = False       # a send whose end was moved to its matched recv's completion
    seq: Optional[int] = None  # per-group sequence number (matching across ranks)
    dtype: Optional[str] = None
    site: Optional[Frame] = None   # innermost user frame that issued it
    returned: Optional[int] = None  # when the launching call returned (None: unknown)
    blocking: Optional[bool] = None  # c10d's async_op was False (None: P2P, unknown)
    # on the device clock: True when it spans the GPU work it launched; False when it launched
    # none (host time only: not device communication); None on the host clock
    on_gpu: Optional[bool] = None


@dataclass(frozen=True, **SLOTS)
class P2PEnd:
    """One send or receive of a rank, as :func:`match_p2p` needs it."""

    group: str
    src: int
    dst: int
    is_recv: bool
    index: int                 # row in its rank's trace
    end: int                   # completion on rank 0's clock, -1 if never completed


@dataclass(frozen=True, **SLOTS)
class P2PLink:
    """A send matched with the receive that consumed it (for flows and send completion)."""

    src: int
    src_index: int             # CommSpan.index on the sender
    dst: int
    dst_index: int


@dataclass
class RankLanes:
    """Everything drawn and measured for one rank. Interval arrays are (n, 2) int64, disjoint."""

    rank: int
    compute: np.ndarray        # busy computing: aten ops plus host time between them
    comm: Records[CommSpan]    # in launch order (lists are converted)
    comm_union: np.ndarray
    passes: Records[Pass]      # in start order (lists are converted)
    steps: dict[int, tuple[int, int]]   # step -> (start, end), steps with a non-empty window
    closed_steps: frozenset[int]   # steps whose end is the next step's boundary marker
    op_start: np.ndarray       # individual compute ops (for the Chrome trace)
    op_end: np.ndarray
    op_name: np.ndarray        # codes into op_names
    op_thread: np.ndarray
    op_names: list[str]
    hidden_ops: int            # compute ops not kept for drawing (DRAWN_OPS)
    annotations: list[Annotation]   # non-pass annotation ranges
    # step -> (schedule, pp, microbatches, virtual stages) | None
    schedules: dict[int, Optional[tuple[Any, ...]]]
    pipeline_group: tuple[int, ...]  # ranks this rank exchanges pipeline messages with (itself)
    clock_error_ns: Optional[int]
    # from the P2P order, when unnamed (lists are converted)
    inferred_passes: Records[Pass] = field(default_factory=lambda: Records(Pass))
    recorded_until: int = 0    # the last event's time: what happened later is not in the trace
    closed: bool = True        # the recorder closed the trace (the rank was not killed)
    stopped: bool = False      # the rank stopped early: killed, failed or interrupted
    clock: Clock = Clock.HOST  # DEVICE: compute, comm, passes and steps are GPU time
    host_compute: Optional[np.ndarray] = None   # on the device clock: what the host did
    device: Optional[DeviceLane] = None         # on the device clock: the GPU activities
    # on the device clock: memcpys and memsets outside collectives (never compute)
    memory: np.ndarray = field(default_factory=lambda: np.zeros((0, 2), dtype=np.int64))
    # live bytes over time by category (recorded by default;
    # viz.analysis.memory.live_bytes.LiveMemory)
    live_memory: Optional[MemoryLane] = None
    # step -> phase -> seconds of its host step window (viz.analysis.timeline.phase_time), every
    # clock
    phase_s: dict[int, dict[str, float]] = field(default_factory=dict)
    # per drawn op, a code into op_arg_texts: its module, phase, source line, shapes and step
    # as the JSON object of its Chrome-trace args (each distinct one once)
    op_args: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    op_arg_texts: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        # Held as columns (viz.analysis.timeline.columns): a 64-rank run has half a million spans
        # and passes.
        self.comm = Records.of(CommSpan, self.comm)
        self.passes = Records.of(Pass, self.passes)
        self.inferred_passes = Records.of(Pass, self.inferred_passes)


@dataclass
class DeviceLane:
    """A rank's GPU activities on rank 0's clock, for drawing (streams) and flows (launches)."""

    start: np.ndarray
    end: np.ndarray
    stream: np.ndarray
    name: np.ndarray           # codes into names
    names: list[str]
    launch: np.ndarray         # when the host launched each (rank 0's clock), -1 unknown
    thread: np.ndarray         # the launching event's recording thread, -1 unknown
    comm: np.ndarray           # bool: part of a collective (NCCL kernel or its copies)
    hidden: int = 0            # activities not kept for drawing
    memory: Optional[np.ndarray] = None   # bool: a memcpy or memset outside a collective


@dataclass
class Timeline:
    """Every rank's lanes on one clock."""

    ranks: dict[int, RankLanes]
    links: Records[P2PLink]    # (lists are converted)
    config: dict[str, Any]
    origin: int                # earliest time of any counted step (drawing origin)

    def __post_init__(self) -> None:
        self.links = Records.of(P2PLink, self.links)


def counted_steps(lane: RankLanes) -> list[int]:
    """Steps the totals sum: the complete ones (closed by the next step's boundary) except step
    0, which runs from the start of the recording and carries one-off setup (model
    construction, allocator warm-up). With none such, every step counts."""
    keys = sorted(lane.steps)
    return [s for s in keys if s in lane.closed_steps and s != 0] or keys
