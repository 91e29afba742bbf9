"""Recording options that are parsed before anything heavy is imported (trace-run checks them
before it launches a worker). Torch-free."""
from __future__ import annotations

from typing import Callable, Optional


def parse_steps(spec) -> Optional[Callable[[int], bool]]:
    """'2-4,7,10-' -> predicate on step index (0-based); None or '' or 'all': every step."""
    if spec is None or (isinstance(spec, str) and spec.strip().lower() in ("", "all")):
        return None
    if isinstance(spec, int):
        spec = str(spec)
    ranges = []
    for part in str(spec).split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if "-" in part:
                lo, hi = part.split("-", 1)
                ranges.append((int(lo) if lo else 0, int(hi) if hi else None))
            else:
                ranges.append((int(part), int(part)))
        except ValueError:
            raise ValueError(f"bad step selection {spec!r}: use e.g. '1-3', '0,2', '2-'") from None
        if ranges[-1][0] < 0 or (ranges[-1][1] is not None and ranges[-1][1] < ranges[-1][0]):
            raise ValueError(f"bad step selection {spec!r}: ranges must be ascending, >= 0")
    return lambda step: any(lo <= step and (hi is None or step <= hi) for lo, hi in ranges)
