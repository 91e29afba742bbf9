"""trace-whatif's renderers, each named after what it writes: the replayed and predicted
timelines (:mod:`.svg`: ``whatif/replay.svg``, ``whatif/target-<i>.svg``), ``whatif.json``
(:mod:`.json`, schema ``paratrace.whatif/1``, docs/whatif.md) and ``whatif.html``
(:mod:`.html`, the ranking page). Each takes a :class:`WhatIfInput`; :data:`RENDERERS` is the
registry, in the order trace-whatif runs it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from ..progress import Progress
from . import html, json, svg

if TYPE_CHECKING:
    from ...whatif import WhatIf


@dataclass
class WhatIfInput:
    """What trace-whatif computed, handed to every renderer of the what-if."""

    result: WhatIf          # the replay and every target's prediction
    run_dir: str            # the recording, as the user named it
    progress: Progress = field(default_factory=Progress)

    REPLAY_SVG: ClassVar[str] = "whatif/replay.svg"

    @staticmethod
    def target_svg(index: int) -> str:
        """The predicted timeline of target ``index`` (0-based), relative to the output dir."""
        return f"whatif/target-{index + 1}.svg"


RENDERERS = (svg, json, html)
PAGE = "whatif.html"        # the page trace-whatif prints
