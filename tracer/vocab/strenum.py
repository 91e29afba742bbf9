"""The base of paratrace's closed sets of words (run.json's failure kinds and statuses, the
watchdog's rules): a str Enum whose members are their values wherever text is made, in JSON,
``str()`` and f-strings, as ``enum.StrEnum`` (Python 3.11) makes them; Python 3.10 has none.

A member equals, and hashes as, its value, so a record read back from JSON (plain strings)
compares with the members, and a file written from members holds the same bytes as one
written from strings.
"""
from __future__ import annotations

from enum import Enum


class StrEnum(str, Enum):
    """A closed set of words; each member is its value as text."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)
