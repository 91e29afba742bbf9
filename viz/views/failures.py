"""A failed rank in words, from run.json's ``ranks`` (instrument/run_record.py writes it) or
from its trace: the line trace-run prints about the first failure, and the report's banner for
each failed rank. One home for the wording, as viz.views.hangs is for hangs; torch-free and
light (trace-run imports it)."""
from __future__ import annotations

from typing import Optional


def rank_failed(rank, error: Optional[str]) -> str:
    """``rank R failed: ERROR``: how a failed rank is named everywhere."""
    return f"rank {rank} failed: {error or 'no error recorded'}"


def first_failure_line(record: dict, local: set) -> Optional[str]:
    """trace-run's one line for the ranks that failed on their own (not ended by the launcher
    or the watchdog): the first failure, and which ranks failed after it (their errors are in
    run.json); None when none did, or when a hang or an interruption ended the run (those have
    lines of their own). ``local``: the ranks of this node."""
    if record["hang"] is not None or record["interrupted"]:
        return None
    failed = [r for r, info in record["ranks"].items()
              if info["status"] == "failed" and not info.get("terminated")]
    if not failed:
        return None
    first = str(record["first_failure"]) if str(record["first_failure"]) in failed else failed[0]
    error = record["ranks"][first]["error"]
    line = rank_failed(first, error) if first in local else \
        f"first failure, on another node: rank {first}: {error}"
    after = [r for r in failed if r != first]
    if after:
        line += f"; then rank(s) {', '.join(after)} failed too (errors in run.json)"
    return line
