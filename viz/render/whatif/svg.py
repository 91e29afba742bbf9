"""The replayed and predicted timelines (``whatif/replay.svg``, ``whatif/target-<i>.svg``): a
simulated run drawn exactly as the measured timeline is (:mod:`viz.render.timeline_svg`),
marked as predicted in its title, a banner line under it and a dashed frame, so a predicted
picture is never taken for a measurement."""
from __future__ import annotations

import os
from typing import TYPE_CHECKING
from xml.sax.saxutils import escape

from ..timeline_svg import render as render_timeline

if TYPE_CHECKING:
    from . import WhatIfInput


def render(whatif: WhatIfInput, report_dir: str) -> list:
    """Write the replay's timeline and every target's into ``report_dir/whatif``, each as soon as
    it is drawn; their paths."""
    result, run_dir = whatif.result, whatif.run_dir
    pictures = [(whatif.REPLAY_SVG, result.replay, result.replay_metrics, "Replayed",
                 f"replayed by trace-whatif: the recorded graph, measured durations ({run_dir})")]
    pictures += [(whatif.target_svg(i), t.timeline, t.metrics, "Predicted",
                  f"predicted by trace-whatif from {run_dir}: {t.title}")
                 for i, t in enumerate(result.targets)]
    written = []
    for rel, timeline, metrics, what, note in pictures:
        written.append(os.path.join(report_dir, rel))
        os.makedirs(os.path.dirname(written[-1]), exist_ok=True)
        with open(written[-1], "w", encoding="utf-8") as fh:
            fh.write(_marked(timeline, metrics, what, note))
    return written


def _marked(timeline, metrics, what: str, note: str) -> str:
    """The SVG text of a simulated ``timeline`` with its ``metrics``: ``what`` names it in the
    title ("Predicted", "Replayed"), ``note`` says from what."""
    svg = render_timeline(timeline, metrics)
    svg = svg.replace(">Timeline", f">{escape(what)} timeline", 1)
    head = svg.index(">", svg.index("<svg")) + 1
    mark = (f'<text x="8" y="33" font-size="11" fill="#b71c1c" class="predicted">'
            f'{escape(note)}</text>'
            '<rect x="1" y="1" width="99.7%" height="99.5%" fill="none" stroke="#b71c1c" '
            'stroke-width="2" stroke-dasharray="8 5" class="predicted"/>')
    body = svg.index("</text>", svg.index('font-size="13"')) + len("</text>")
    out = svg[:body] + mark + svg[body:]
    return out[:head].replace("<svg ", '<svg class="predicted" ', 1) + out[head:]
