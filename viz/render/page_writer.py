"""HTML pages from jinja2 templates (viz/templates), autoescaped and fully offline.

Every page extends ``base.html`` (inline CSS, no external URL) and loads one shared script,
``svgview.js`` (pan, zoom and search of the pictures), which the writer copies once into the
directory it writes. Templates get the number formats of :mod:`viz.render` as filters and
``root``, the relative path from the page back to the directory's top, so links work wherever
the report is copied.
"""
from __future__ import annotations

import json
import os
import re
import shutil

import jinja2
from markupsafe import Markup, escape

from ..views.formatters import fmt_bytes, fmt_count, fmt_flops, fmt_ranks, fmt_time, steps_text

_TEMPLATES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                          "templates")
SCRIPT = "svgview.js"      # every page's script, next to index.html (or diff.html)


def _brief(value) -> str:
    """A compact one-line text of any JSON-like value (run.json's free-form fields)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(", ", ": "), default=str)


_BREAK_AFTER = re.compile(r"([._/:])")


def _breakable(value) -> Markup:
    """Escaped text with a line-break opportunity (<wbr>) after each '.', '_', '/' and ':',
    so a long op name or path wraps inside a narrow table column instead of widening it."""
    return Markup(_BREAK_AFTER.sub(r"\1<wbr>", str(escape(value))))


def environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(_TEMPLATES), autoescape=True,
                             undefined=jinja2.StrictUndefined, trim_blocks=True,
                             lstrip_blocks=True)
    env.filters.update(time=fmt_time, bytes=fmt_bytes, count=fmt_count, flops=fmt_flops,
                       ranks=fmt_ranks, steps=steps_text, brief=_brief,
                       breakable=_breakable)
    return env


class PageWriter:
    """Writes pages into one report directory."""

    def __init__(self, report_dir: str):
        self.report_dir = report_dir
        self.env = environment()
        self._script_written = False

    def write(self, rel_path: str, template: str, **context) -> str:
        """Render ``template`` to ``report_dir/rel_path``; returns the absolute path."""
        if not self._script_written:
            os.makedirs(self.report_dir, exist_ok=True)
            shutil.copyfile(os.path.join(_TEMPLATES, SCRIPT), os.path.join(self.report_dir, SCRIPT))
            self._script_written = True
        depth = rel_path.count("/")
        # streamed piece by piece: a page with a big inline SVG is never whole in memory
        return self.write_text(rel_path, self.env.get_template(template).generate(
            root="../" * depth, script=SCRIPT, **context))

    def write_text(self, rel_path: str, text) -> str:
        """Write ``text`` (a str, or an iterable of str pieces) to ``report_dir/rel_path``."""
        path = os.path.join(self.report_dir, rel_path)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as fh:
            if isinstance(text, str):
                fh.write(text)
            else:
                fh.writelines(text)
        return path
