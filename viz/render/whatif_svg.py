"""Predicted timelines: a simulated run drawn exactly as the measured timeline is
(:mod:`viz.render.timeline_svg`), marked as predicted in its title, a banner line under it and
a dashed frame, so a predicted picture is never taken for a measurement."""
from __future__ import annotations

from xml.sax.saxutils import escape

from .timeline_svg import render as render_timeline


def render_predicted(timeline, metrics, what: str, note: str) -> str:
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
