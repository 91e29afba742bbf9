"""The number and range formats every page, picture and terminal line shares, so a time, a byte
count or a range of ranks reads the same in an SVG tooltip, an HTML table and on stderr."""
from __future__ import annotations

from typing import Iterable, Optional, Sequence

# The most a picture's label or tooltip says: graphviz refuses a quoted string longer than
# 16,384 bytes (2.43: "syntax error ... longer than 16384?"), and no reader wants thousands of
# op names in a tooltip. Lists are cut with "and N more"; a single line with a count of what was
# left out.
LIST_MOST = 12          # items of a list in a label or tooltip
LINE_MOST = 400         # characters of one line
LINES_MOST = 40         # lines of one label or tooltip
ITEM_MOST = 80          # characters of one item of a list (a templated CUDA kernel's name)


def cut(text: str, most: int) -> str:
    """``text`` cut to ``most`` characters, saying how many more there were."""
    text = str(text)
    return text if len(text) <= most else \
        f"{text[:most]}... ({len(text) - most:,} more characters)"


def first_of(items: Sequence[str], most: int = LIST_MOST, what: str = "") -> list[str]:
    """The first ``most`` of ``items`` and, where there are more, ``and N more`` (``what``:
    what they are, ``op kinds``)."""
    items = list(items)
    if len(items) <= most:
        return items
    rest = len(items) - most
    return items[:most] + [f"and {rest:,} more" + (f" {what}" if what else "")]


def bounded_lines(lines: Iterable[str], line_most: int = LINE_MOST,
                  lines_most: int = LINES_MOST) -> list[str]:
    """``lines`` for a label or tooltip: each cut to ``line_most`` characters (``... (N more
    characters)``), at most ``lines_most`` of them (``and N more lines``)."""
    return first_of([cut(line, line_most) for line in lines], lines_most, "lines")


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


def fmt_rate(bytes_per_s: Optional[float]) -> str:
    """A bandwidth in decimal units, as nccl-tests and NICs say them: ``31.6 kB/s``,
    ``12.3 MB/s``, ``4.56 GB/s``; empty when unknown."""
    if bytes_per_s is None:
        return ""
    value, units, i = float(bytes_per_s), ("B/s", "kB/s", "MB/s", "GB/s", "TB/s"), 0
    while value >= 999.5 and i < len(units) - 1:
        value /= 1000
        i += 1
    return f"{value:.3g} {units[i]}"


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


def short_op(op: str) -> str:
    """``aten.mm.default`` -> ``mm``; ``c10d.allreduce_.default`` -> ``c10d.allreduce_``."""
    parts = op.split(".")
    if len(parts) == 3 and parts[0] == "aten":
        return parts[1] if parts[2] == "default" else f"{parts[1]}.{parts[2]}"
    return ".".join(parts[:2]) if parts[-1] == "default" else op


# ---------------------------------------------------------------------------- ranges
def runs_of(values: Iterable[int]) -> list:
    """(first, last) of each run of consecutive integers among ``values``, in order."""
    out: list = []
    for v in sorted(set(int(v) for v in values)):
        if out and v == out[-1][1] + 1:
            out[-1] = (out[-1][0], v)
        else:
            out.append((v, v))
    return out


def range_text(first: int, last: int) -> str:
    """``3``, ``2-999``."""
    return str(first) if first == last else f"{first}-{last}"


def runs_text(values: Iterable[int], sep: str = ", ") -> str:
    """``0-3, 5``: the runs of ``values`` (:func:`runs_of`), joined by ``sep``."""
    return sep.join(range_text(first, last) for first, last in runs_of(values))


def fmt_ranks(ranks) -> str:
    """Ranks as compact ranges: ``0-3``, ``0,2``, ``1-2,5``."""
    return runs_text(ranks, ",")


def rank_run_text(first: int, last: int) -> str:
    """A run of ranks in words: ``rank 3``, ``ranks 2-999``."""
    return f"rank {first}" if first == last else f"ranks {range_text(first, last)}"


def steps_text(steps) -> str:
    """``step 1``, ``steps 1-9``, ``steps 0, 10``; ``no steps``."""
    if not steps:
        return "no steps"
    return ("step " if len(steps) == 1 else "steps ") + runs_text(steps)


def site_text(frame) -> str:
    """A source line, ``file:line`` (a recorded frame; '' for None)."""
    return f"{frame.file}:{frame.line}" if frame is not None else ""


def rank_list(ranks) -> str:
    """``rank 2``, ``ranks 1,3``: ranks listed one by one (who issued what)."""
    return f"rank{'s' if len(ranks) != 1 else ''} {','.join(map(str, ranks))}"

