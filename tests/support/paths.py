"""The repository's paths, defined once for every test and helper."""
from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
REPO = TESTS.parent
SCRIPTS = TESTS / "scripts"          # the programs tests run under the recorder or trace-run
ASSETS = TESTS / "assets"            # recordings and exports from real runs (read-only)
GPU_FIXTURE = ASSETS / "gpu-h100"    # the H100 recording and profiler exports


def line_of(path, text: str) -> int:
    """The number of the only line of ``path`` (or of tests/scripts/``path``) holding
    ``text``: tests name source lines by content, so edits above them break nothing."""
    path = Path(path)
    if not path.is_absolute() and not path.exists():
        path = SCRIPTS / path
    hits = [i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line]
    assert len(hits) == 1, f"{text!r} found at lines {hits} of {path}"
    return hits[0]


PACKAGES = ("tracer", "instrument", "viz", "sample_runs")


def modules() -> dict:
    """module name -> path, for every module of paratrace's packages."""
    out = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            out[name] = path
    return out
