"""A predicted step's order of things, laid on the recorded step: the work before the first
micro-batch, each micro-batch, the work after the last one (the optimizer, the next step's
zero_grad), each a *segment* taken from a window of the recorded step (rank 0's clock).

While the micro-batch count stays, segment i is recorded micro-batch i. When it changes,
every predicted micro-batch is a copy of the recorded last one (the one that synchronises
gradients under DDP's ``no_sync``). A *position* ``(segment, t, order)`` sorts what happens
in the predicted step: recorded things at their times, added ones (a collective, an unsharded
parameter) at the time they are anchored to, ``order`` breaking ties in the order FSDP2 does
them at one instant.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .windows import StepWindows

PRE, POST = "pre", "post"


@dataclass(frozen=True)
class Segment:
    lo: int                       # the recorded window it copies: [lo, hi)
    hi: int
    micro: Optional[int] = None   # the predicted micro-batch it is, None: before or after
    source: Optional[int] = None  # the recorded micro-batch it copies


class Axis:
    """The segments of a predicted step of ``microbatches`` micro-batches."""

    def __init__(self, windows: StepWindows, microbatches: int):
        micro = windows.micro
        lo, hi = windows.span
        self.windows = windows
        self.microbatches = microbatches
        self.same = microbatches == len(micro)
        if not micro:
            self.segments = [Segment(lo, hi + 1)]
            return
        first = micro[0].forward[0]
        last = micro[-1].backward[1]
        segments = [Segment(lo, first)]
        if self.same:
            bounds = [m.forward[0] for m in micro] + [last + 1]
            segments += [Segment(bounds[i], bounds[i + 1], i, i) for i in range(len(micro))]
        else:
            template = micro[-1]
            segments += [Segment(template.forward[0], last + 1, i, len(micro) - 1)
                         for i in range(microbatches)]
        segments.append(Segment(last + 1, max(hi, last) + 1))
        self.segments = segments

    @property
    def micro_segments(self) -> list:
        return [i for i, s in enumerate(self.segments) if s.micro is not None]

    def places(self, t: int) -> list:
        """Every segment index whose window holds recorded time ``t`` (several where the
        micro-batch is copied; none where it was dropped)."""
        return [i for i, s in enumerate(self.segments) if s.lo <= t < s.hi]

    def place(self, t: int, micro: Optional[int] = None) -> Optional[int]:
        """The segment of recorded time ``t``: in micro-batch ``micro`` where it is copied."""
        found = self.places(t)
        if micro is not None:
            found = [i for i in found if self.segments[i].micro == micro] or found
        if found:
            return found[0]
        if t < self.segments[0].lo:
            return 0
        if t >= self.segments[-1].hi:
            return len(self.segments) - 1
        return None

    def first_micro(self) -> int:
        return self.micro_segments[0] if self.micro_segments else 0

    def last_micro(self) -> int:
        return self.micro_segments[-1] if self.micro_segments else 0

    def source(self, segment: int) -> Optional[int]:
        return self.segments[segment].source
