"""trace-whatif's renderers, each named after what it writes: the ranking on the terminal
(:mod:`.text`, without ``--out``), and with ``--out DIR`` the replayed and predicted timelines
(:mod:`.svg`: ``whatif/replay.svg``, ``whatif/target-<i>.svg``), ``whatif.json``
(:mod:`.json`, schema ``paratrace.whatif/1``, docs/whatif.md) and ``whatif.html``
(:mod:`.html`, the ranking page). Each takes a :class:`WhatIfInput`; the registry is
:data:`RENDERERS`, :data:`TERMINAL` then :data:`FILES`, in the order trace-whatif runs them."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, ClassVar

from ..progress import Progress
from . import html, json, svg, text

if TYPE_CHECKING:
    from ...whatif import WhatIf


@dataclass
class WhatIfInput:
    """What trace-whatif computed, handed to every renderer of the what-if."""

    result: WhatIf          # the replay and every target's prediction
    run_dir: str            # the recording, as the user named it
    progress: Progress = field(default_factory=Progress)
    say: Callable[[str], None] = print      # where the terminal ranking goes

    REPLAY_SVG: ClassVar[str] = "whatif/replay.svg"

    @staticmethod
    def target_svg(index: int) -> str:
        """The predicted timeline of target ``index`` (0-based), relative to the output dir."""
        return f"whatif/target-{index + 1}.svg"


TERMINAL = (text,)              # without --out
FILES = (svg, json, html)       # with --out DIR
RENDERERS = TERMINAL + FILES
PAGE = "whatif.html"        # the page trace-whatif prints
