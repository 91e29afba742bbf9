"""Records held as numpy columns: a rank's collectives, passes and P2P links by the thousand.

A 64-rank run holds about half a million :class:`viz.analysis.timeline.lanes.CommSpan` s and a
quarter million passes and links. As Python objects each costs about 270 bytes, and unpickling them
from the worker processes is much of the report process's work; as :class:`Records` they cost a
tenth of that. ``Records`` is a read-only sequence of the dataclass it was made from: indexing and
iteration give records built on the fly, so code that walks a lane's records reads them as it
always did, while code that needs many of them at once reads :meth:`Records.column`.

Each field is stored by what its values are: integers (None allowed) as int64 with a mask of
the Nones, booleans as bool, anything else (strings, frames) as int32 codes into a table of the
distinct values, each held once.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Generic, Iterable, Iterator, TypeVar, Union, overload

import numpy as np

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

_R = TypeVar("_R", bound="DataclassInstance")           # the dataclass of the records
_T = TypeVar("_T", bound="DataclassInstance")


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


class Records(Generic[_R]):
    """Records of one dataclass ``cls`` as columns (see the module docstring)."""

    __slots__ = ("cls", "fields", "columns", "nones", "tables", "_by")

    def __init__(self, cls: type[_R], records: Iterable[_R] = ()) -> None:
        self.cls = cls
        self.fields = tuple(f.name for f in dataclasses.fields(cls))
        given = list(records)
        self.columns: dict[str, np.ndarray] = {}
        self.nones: dict[str, np.ndarray] = {}       # where an int field is None
        self.tables: dict[str, list[Any]] = {}       # a coded field's distinct values
        self._by: dict[str, np.ndarray] = {}         # a field's sort order, for find()
        for name in self.fields:
            values = [getattr(r, name) for r in given]
            present = [v for v in values if v is not None]
            if values and all(isinstance(v, (bool, np.bool_)) for v in values):
                self.columns[name] = np.array(values, dtype=bool)
            elif all(_is_int(v) for v in present):          # no records: empty int columns
                none = np.array([v is None for v in values], dtype=bool)
                self.columns[name] = np.array([0 if v is None else v for v in values], np.int64)
                if none.any():
                    self.nones[name] = none
            else:
                table: dict[Any, int] = {}
                codes = [table.setdefault(v, len(table)) for v in values]
                self.tables[name] = list(table)
                self.columns[name] = np.array(codes, dtype=np.int32)

    @staticmethod
    def of(record: type[_T], records: Iterable[_T]) -> Records[_T]:
        """``records`` as Records (as they are if they already are)."""
        return records if isinstance(records, Records) else Records(record, records)

    def _subset(self, which: Union[slice, np.ndarray]) -> Records[_R]:
        out: Records[_R] = Records.__new__(Records)
        out.cls, out.fields, out.tables, out._by = self.cls, self.fields, self.tables, {}
        out.columns = {name: col[which] for name, col in self.columns.items()}
        out.nones = {name: none[which] for name, none in self.nones.items()}
        return out

    # ------------------------------------------------------------------ the sequence
    def __len__(self) -> int:
        return len(self.columns[self.fields[0]]) if self.fields else 0

    @overload
    def __getitem__(self, i: int) -> _R: ...
    @overload
    def __getitem__(self, i: Union[slice, np.ndarray]) -> Records[_R]: ...

    def __getitem__(self, i: Union[int, slice, np.ndarray]) -> Union[_R, Records[_R]]:
        if isinstance(i, slice) or isinstance(i, np.ndarray):
            return self._subset(i)
        i = range(len(self))[i]          # negative indices, IndexError
        return self.cls(*(self._value(name, i) for name in self.fields))

    def _value(self, name: str, i: int) -> Any:
        if name in self.nones and self.nones[name][i]:
            return None
        v = self.columns[name][i]
        return self.tables[name][v] if name in self.tables else v.item()

    def __iter__(self) -> Iterator[_R]:
        return map(self.cls, *(self.values(name) for name in self.fields))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (Records, list, tuple)):
            return len(self) == len(other) and list(self) == list(other)
        return NotImplemented

    def __add__(self, other: Iterable[_R]) -> Records[_R]:
        return Records(self.cls, list(self) + list(other))

    def __repr__(self) -> str:
        return f"Records({self.cls.__name__}, {len(self)})"

    # ------------------------------------------------------------------ columns
    def column(self, name: str) -> np.ndarray:
        """An integer or boolean field as an array (a None reads as -1)."""
        if name in self.tables:
            raise TypeError(f"{name} is not a numeric field")
        col = self.columns[name]
        return np.where(self.nones[name], -1, col) if name in self.nones else col

    def values(self, name: str) -> list[Any]:
        """A field's values as a list, Nones included."""
        col = self.columns[name].tolist()
        if name in self.tables:
            table = self.tables[name]
            return [table[c] for c in col]
        if name in self.nones:
            return [None if n else v for v, n in zip(col, self.nones[name].tolist())]
        return col

    def where(self, name: str, value: Any) -> np.ndarray:
        """Positions whose field ``name`` equals ``value``."""
        if name in self.tables:
            table = self.tables[name]
            return np.nonzero(self.columns[name] == table.index(value))[0] \
                if value in table else np.zeros(0, np.int64)
        none = self.nones.get(name, np.zeros(len(self), bool))
        if value is None:
            return np.nonzero(none)[0]
        if not (_is_int(value) or isinstance(value, (bool, np.bool_))):
            return np.zeros(0, np.int64)      # an integer field (or no records) holds no such
        return np.nonzero((self.columns[name] == value) & ~none)[0]

    def find(self, name: str, value: int) -> int:
        """The position of the first record whose integer field ``name`` is ``value``, else
        -1 (binary search over the field's order, computed once)."""
        order = self._by.get(name)
        if order is None:
            order = self._by[name] = np.argsort(self.column(name), kind="stable")
        col = self.column(name)
        i = int(np.searchsorted(col, value, sorter=order))
        return int(order[i]) if i < len(order) and col[order[i]] == value else -1

    def __getstate__(self) -> dict[str, Any]:
        return {"cls": self.cls, "columns": self.columns, "nones": self.nones,
                "tables": self.tables}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.cls = state["cls"]
        self.fields = tuple(f.name for f in dataclasses.fields(self.cls))
        self.columns, self.nones, self.tables = state["columns"], state["nones"], state["tables"]
        self._by = {}
