"""The trace's dictionary columns while recording: each string gets a small id, once.

Ids only grow and no value is ever removed, so every flush hands the writer each column's full
value list and the writer sends only the entries the file has not seen (dictionary deltas,
format.py). ``stack`` and ``fwd_stack`` share the stack interner's values
(recorder/attribution/stacks.py).
"""
from __future__ import annotations

from typing import Any

from .format import DICT_COLUMNS

STACK_COLUMNS = ("stack", "fwd_stack")


class Interner:
    """Strings -> small ids; ``values`` only grows (the writer relies on it for deltas)."""

    __slots__ = ("ids", "values")

    def __init__(self) -> None:
        self.ids: dict[str, int] = {}
        self.values: list[str] = []

    def __call__(self, text: str) -> int:
        i = self.ids.get(text)
        if i is None:
            i = self.ids[text] = len(self.values)
            self.values.append(text)
        return i


class Dictionaries:
    """One interner per dictionary column; the stack columns use ``stacks`` (a StackInterner)."""

    def __init__(self, stacks: Any) -> None:      # a StackInterner
        self.stacks = stacks
        self.interners = {name: Interner() for name in DICT_COLUMNS if name not in STACK_COLUMNS}
        self.op = self.interners["op"]
        self.module = self.interners["module"]
        self.annotation = self.interners["annotation"]
        self.shapes = self.interners["shapes"]
        self.kind = self.interners["kind"]
        self.group = self.interners["group"]
        self.dtype = self.interners["dtype"]

    def values(self) -> dict[str, list[str]]:
        """Column name -> its value list (the live lists: hand them to the writer only)."""
        values = {name: interner.values for name, interner in self.interners.items()}
        for name in STACK_COLUMNS:
            values[name] = self.stacks.values
        return values
