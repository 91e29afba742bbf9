"""trace-diff's terminal output: the table of :mod:`viz.views.diff_table` (the verdict, the
largest changes, the time metrics), handed to ``diff.say``; no file."""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from ...views.diff_table import format_table

if TYPE_CHECKING:
    from . import DiffInput


def render(diff: DiffInput, report_dir: Optional[str]) -> list:
    """Say the table of the ``diff.top`` largest changes; writes nothing."""
    diff.say(format_table(diff.result, top=diff.top))
    return []
