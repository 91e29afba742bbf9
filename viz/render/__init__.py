"""Renderers: turn what viz/ analyses computed into SVG (graphviz) and HTML (jinja2).

Renderers only draw; they never aggregate traces. This module holds the number formats every
renderer shares, so a time or a byte count reads the same in an SVG tooltip and an HTML table.
"""
from __future__ import annotations


def fmt_time(ns: float) -> str:
    """Nanoseconds as a short human time: ``812 ns``, ``3.4 us``, ``12.5 ms``, ``2.10 s``."""
    ns = float(ns)
    if ns < 1e3:
        return f"{ns:.0f} ns"
    if ns < 1e6:
        return f"{ns / 1e3:.1f} us"
    if ns < 1e9:
        return f"{ns / 1e6:.1f} ms"
    return f"{ns / 1e9:.2f} s"


def fmt_bytes(n: float) -> str:
    """Bytes with binary units: ``512 B``, ``32.0 KiB``, ``1.5 MiB``."""
    n, units, i = float(n), ("B", "KiB", "MiB", "GiB", "TiB"), 0
    while n >= 1024 and i < len(units) - 1:
        n /= 1024
        i += 1
    return f"{n:.0f} B" if i == 0 else f"{n:.1f} {units[i]}"


def fmt_count(n: float) -> str:
    """Counts with a thousands separator: ``1,234``."""
    return f"{int(n):,}"


def fmt_flops(n: float) -> str:
    """FLOPs with SI units: ``524 k``, ``1.57 M``, ``3.2 G``."""
    n = float(n)
    for unit, scale in (("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f}"


def fmt_ranks(ranks) -> str:
    """Ranks as compact ranges: ``0-3``, ``0,2``, ``1-2,5``."""
    ranks = sorted(set(int(r) for r in ranks))
    parts, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        parts.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ",".join(parts)


def short_op(op: str) -> str:
    """``aten.mm.default`` -> ``mm``; ``c10d.allreduce_.default`` -> ``c10d.allreduce_``."""
    parts = op.split(".")
    if len(parts) == 3 and parts[0] == "aten":
        return parts[1] if parts[2] == "default" else f"{parts[1]}.{parts[2]}"
    return ".".join(parts[:2]) if parts[-1] == "default" else op


def inline_svg(svg: str) -> str:
    """An SVG document without its XML prolog and DOCTYPE, to embed in an HTML page."""
    start = svg.find("<svg")
    return svg[start:] if start >= 0 else svg
