"""The type check (mypy.ini) runs clean over the rooms it lists, at least those of ROOMS (the
torch-free rooms and trace-run), with parametrised generics and annotated functions required
there. mypy runs in this process (mypy.api; tests/unit starts none), its cache in the checkout's
.mypy_cache, so a run after the first re-checks only what changed."""
from __future__ import annotations

import configparser

import mypy.api
import pytest

from support.paths import REPO

ROOMS = {"tracer/vocab", "tracer/files", "tracer/kineto", "viz/analysis", "instrument"}


def mypy_run(*extra: str) -> tuple[str, int]:
    out, err, status = mypy.api.run(["--config-file", str(REPO / "mypy.ini"), *extra])
    return out + err, status


@pytest.fixture(autouse=True)
def in_the_checkout(monkeypatch):
    monkeypatch.chdir(REPO)           # mypy.ini's paths are the checkout's


def test_the_checked_rooms_are_the_torch_free_ones_and_trace_run():
    config = configparser.ConfigParser()
    config.read(REPO / "mypy.ini")
    assert {p.strip() for p in config["mypy"]["files"].split(",")} >= ROOMS
    for strict in ("disallow_any_generics", "disallow_untyped_defs", "check_untyped_defs"):
        assert config["mypy"].getboolean(strict), strict


def test_the_checked_rooms_type_check_clean():
    report, status = mypy_run()
    assert status == 0 and report.startswith("Success: no issues found"), report


def test_the_check_catches_a_planted_fault(tmp_path):
    """A checked module (tracer/vocab/outcomes.py) with a wrong return type, a bare ``dict``
    and a function without annotations planted in it: mypy names each."""
    planted = tmp_path / "outcomes.py"
    planted.write_text((REPO / "tracer" / "vocab" / "outcomes.py").read_text()
                       + "\n\ndef kinds() -> int:\n    return 'error'\n"
                       + "\n\ndef facts(record: dict) -> None:\n    pass\n"
                       + "\n\ndef words(record):\n    return record\n")
    report, status = mypy_run("--shadow-file", "tracer/vocab/outcomes.py", str(planted))
    assert status == 1, report
    found = sorted(line.split("[")[-1].rstrip("]") for line in report.splitlines()
                   if line.startswith("tracer/vocab/outcomes.py:"))
    assert found == ["no-untyped-def", "return-value", "type-arg"], report
