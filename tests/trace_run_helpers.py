"""Helpers of the tests that run trace-run for real (test_trace_run*.py): the command in a
subprocess, its own lines on stderr, run.json, and waiting for processes and files without
sleeping for a fixed time (tests/waiting.py)."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from conftest import CPU_ONLY

SCRIPTS = Path(__file__).parent / "scripts"
C10D = str(SCRIPTS / "trace_run_c10d.py")
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **CPU_ONLY)
# trace-run's progress lines on stderr; every other line of its own names a problem
PHASES = ("launching ", "recorded ", "gathering traces from ", "building the report")


def trace_run(*args, cwd, timeout=180, env=ENV) -> subprocess.CompletedProcess:
    return subprocess.run(["trace-run", *map(str, args)], cwd=cwd, env=env, text=True,
                          capture_output=True, timeout=timeout)


def run_json(out: Path) -> dict:
    return json.loads((out / "run.json").read_text())


def comm_counts(trace) -> dict:
    counts: dict = {}
    for rec in trace.records():
        if rec["kind"]:
            counts[rec["kind"]] = counts.get(rec["kind"], 0) + 1
    return counts


def assert_no_traceback(proc: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]


def own_lines(stderr: str) -> list:
    """trace-run's own lines on stderr, without the prefix."""
    return [line[len("trace-run: "):] for line in stderr.splitlines()
            if line.startswith("trace-run: ")]


def problems(stderr: str) -> list:
    """trace-run's lines that are not progress: one per problem, never twice the same."""
    lines = [line for line in own_lines(stderr) if not line.startswith(PHASES)]
    assert len(lines) == len(set(lines)), lines
    return lines


def script_line(script, text: str) -> int:
    """The line number of ``text`` in a test script (so edits above it don't break tests)."""
    lines = Path(script).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line)
