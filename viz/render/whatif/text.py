"""trace-whatif's terminal output: the ranking of :mod:`viz.views.whatif_rows`, handed to
``whatif.say``; no file."""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from ...views.whatif_rows import ranking_table

if TYPE_CHECKING:
    from . import WhatIfInput


def render(whatif: WhatIfInput, report_dir: Optional[str]) -> list:
    """Say the ranking; writes nothing."""
    whatif.say(ranking_table(whatif.result))
    return []
