"""Which source file of run B is which of run A, when their names differ.

Call-graph functions are matched by short file path and qualified name
(:func:`.profile.function_key`). Two scripts that run the same model code (``ddp_train.py`` and
``fsdp2_train.py``, each with its copy of the model and the loop) share no file name, so every
function of one would be "removed" and every function of the other "added", nothing matched.
A file that only B recorded is taken for the file that only A recorded whose qualified names
it shares most, when they share at least half of the smaller file's: the scripts' ``<module>``
and ``main`` and their model's ``Block.forward`` match; unrelated files do not.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable, Mapping


@dataclass(frozen=True)
class FileMatch:
    """B's ``b`` (a short display path) is compared as A's ``a``; ``shared`` qualified names
    are in both."""

    a: str
    b: str
    shared: int


def _names(groups: Iterable, paths: Mapping[str, str]) -> dict:
    """display path -> the qualified names of its call-graph functions."""
    out: dict = defaultdict(set)
    for grp in groups:
        for frame in grp.path:
            out[paths.get(frame.file, frame.file)].add(frame.qualname)
    return out


def match_files(groups_a: Iterable, paths_a: Mapping[str, str], groups_b: Iterable,
                paths_b: Mapping[str, str]) -> tuple:
    """(B's display paths with each matched file shown as A's, [FileMatch]); files both runs
    recorded keep their names."""
    names_a, names_b = _names(groups_a, paths_a), _names(groups_b, paths_b)
    only_a = [f for f in sorted(names_a) if f not in names_b]
    only_b = [f for f in sorted(names_b) if f not in names_a]
    pairs = []
    for b in only_b:
        for a in only_a:
            shared = len(names_a[a] & names_b[b])
            if shared and 2 * shared >= min(len(names_a[a]), len(names_b[b])):
                pairs.append((-shared, a, b))
    found: list = []
    taken_a: set = set()
    taken_b: set = set()
    for minus, a, b in sorted(pairs):
        if a not in taken_a and b not in taken_b:
            found.append(FileMatch(a, b, -minus))
            taken_a.add(a)
            taken_b.add(b)
    as_a = {m.b: m.a for m in found}
    return {file: as_a.get(shown, shown) for file, shown in paths_b.items()}, found
