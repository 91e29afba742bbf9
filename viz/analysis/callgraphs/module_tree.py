"""The module view: the nn.Module tree of a run with ops, FLOPs, time and communication.

Module paths come from the trace (``GPTChunk.blocks.0.attn.qkv``; backward ops carry the module
of the forward op that created them). Each row holds what ran directly in the module (``own``)
and in it and its submodules (``total``), split by direction, by rank and by collective kind.
Ops outside any module (optimizer, grad sync, data loading) are one ``(no module)`` row.
"""
from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Iterable, Union

from tracer.vocab.labels import PHASES

from .callgraph import OpGroup, Weights

NO_MODULE = "(no module)"


@dataclass
class ModuleRow:
    """One module of the tree."""

    path: str
    depth: int
    own: Weights = field(default_factory=Weights)
    total: Weights = field(default_factory=Weights)
    # inclusive: by direction (phase), by rank, by (collective kind, direction)
    by_direction: defaultdict[str, Weights] = field(default_factory=lambda: defaultdict(Weights))
    per_rank: defaultdict[int, Weights] = field(default_factory=lambda: defaultdict(Weights))
    comm: defaultdict[tuple[str, str], Weights] = field(
        default_factory=lambda: defaultdict(Weights))
    children: list[ModuleRow] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.path.rsplit(".", 1)[-1] if self.path != NO_MODULE else self.path

    @property
    def ranks(self) -> tuple[int, ...]:
        return tuple(sorted(r for r, w in self.per_rank.items() if w.ops))

    def ops_by_phase(self) -> list[tuple[str, int]]:
        """(phase, ops) of every phase with ops in the module: forward to optimizer, then other."""
        return [(p, self.by_direction[p].ops) for p in PHASES[1:] + PHASES[:1]
                if p in self.by_direction and self.by_direction[p].ops]


def _natural(path: str) -> list[Union[int, str]]:
    """Sort key putting ``blocks.10`` after ``blocks.9``."""
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", path)]


def module_tree(groups: Iterable[OpGroup]) -> list[ModuleRow]:
    """Every module (and each ancestor) as a :class:`ModuleRow`, in depth-first order."""
    rows: dict[str, ModuleRow] = {}

    def row(path: str) -> ModuleRow:
        if path not in rows:
            depth = 0 if path == NO_MODULE else path.count(".")
            rows[path] = ModuleRow(path, depth)
            if path != NO_MODULE and "." in path:
                parent = row(path.rsplit(".", 1)[0])
                parent.children.append(rows[path])
        return rows[path]

    for grp in groups:
        w = grp.weights()
        path = grp.module or NO_MODULE
        row(path).own.add(w)
        parts = [path] if path == NO_MODULE else \
            [".".join(path.split(".")[:i]) for i in range(1, path.count(".") + 2)]
        for p in parts:
            r = row(p)
            r.total.add(w)
            r.by_direction[grp.phase].add(w)
            r.per_rank[grp.rank].add(w)
            if grp.kind:
                r.comm[(grp.kind, grp.phase)].add(w)

    out: list[ModuleRow] = []

    def visit(r: ModuleRow) -> None:
        out.append(r)
        for child in sorted(r.children, key=lambda c: _natural(c.path)):
            visit(child)
    roots = [r for r in rows.values() if r.depth == 0]
    for r in sorted(roots, key=lambda r: (r.path == NO_MODULE, _natural(r.path))):
        visit(r)
    return out
