"""trace-diff's renderers, each named after what it writes: the table on the terminal
(:mod:`.terminal_table`, always), and with ``--out DIR`` the diff call graphs
(:mod:`.diff_callgraphs`: ``diff-callgraph*.svg``), ``diff.json`` (:mod:`.diff_json`, schema
``paratrace.diff/1``, docs/diff.md) and ``diff.html`` (:mod:`.diff_html`). Each takes a
:class:`DiffInput`; the registry is :data:`RENDERERS`, :data:`TERMINAL` then :data:`FILES`, in the
order trace-diff runs them."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Callable

from ...diff.diffgraph import prune_diff
from ...diff.result import DiffResult
from ..diffgraph_svg import diff_svgs
from ..progress import Progress
from . import diff_callgraphs, diff_html, diff_json, terminal_table


@dataclass
class DiffInput:
    """What trace-diff computed, handed to every renderer of the diff."""

    result: DiffResult
    top: int = 15                                   # rows of the terminal table
    say: Callable[[str], None] = print              # where the terminal table goes
    progress: Progress = field(default_factory=Progress)

    @property
    def svg_files(self) -> dict:
        """scope -> the file name of its diff call graph, relative to the output directory."""
        scopes = dict.fromkeys(g.scope for g in self.result.graphs)
        return {scope: "diff-callgraph.svg" if i == 0 else f"diff-callgraph-{i}.svg"
                for i, scope in enumerate(scopes)}

    @cached_property
    def svgs(self) -> dict:
        """scope -> the SVG text of its diff call graph (pruned), drawn once, in parallel: the
        files and inline in diff.html. Raises :class:`..callgraph_svg.RenderError`."""
        r = self.result
        return diff_svgs([prune_diff(g) for g in r.graphs], r.a.dir, r.b.dir)


TERMINAL = (terminal_table,)    # always
FILES = (diff_callgraphs, diff_json, diff_html)   # with --out DIR
RENDERERS = TERMINAL + FILES
PAGE = "diff.html"              # the page trace-diff prints last
