"""paratrace's commands as users run them, in a subprocess: one runner for trace-run,
trace-report, trace-diff and trace-whatif (the console scripts pip installed beside this
Python), and for ``python -m``/``python -c``; the environment every process a test starts gets;
and what the tests read back: trace-run's own lines on stderr, run.json. In the spirit of
viztracer's tests/cmdline_tmpl.py."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from support.paths import SCRIPTS

# Merged into the environment of every process a test starts: no GPU is visible to it, so the
# reference GPT and the test scripts take the CPU and gloo whatever the machine has.
CPU_ONLY = {"CUDA_VISIBLE_DEVICES": ""}
# one BLAS thread a process (the machine has 2 cores and tests start up to 4 ranks), output
# unbuffered (a killed process's last lines are kept)
ENV = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", **CPU_ONLY)
C10D = str(SCRIPTS / "trace_run_c10d.py")
# trace-run's progress lines on stderr; every other line of its own names a problem
PHASES = ("launching ", "recorded ", "gathering traces from ", "building the report")
COMMANDS = ("trace-run", "trace-report", "trace-diff", "trace-whatif")


def command_path(name: str) -> str:
    """The installed console script ``name``: beside this Python, else on PATH."""
    script = os.path.join(os.path.dirname(sys.executable), name)
    found = script if os.path.exists(script) else shutil.which(name)
    assert found, f"{name} is not installed (pip install -e .)"
    return found


def run(command, *args, cwd=None, env=None, timeout=300) -> subprocess.CompletedProcess:
    """Run one of :data:`COMMANDS` (or ``python`` for this interpreter, or any argv list)
    with ``args``; text output captured, never raising on a non-zero exit."""
    if command in COMMANDS:
        argv = [command_path(command)]
    elif command == "python":
        argv = [sys.executable]
    else:
        argv = list(command)
    return subprocess.run([*argv, *map(str, args)], cwd=cwd, env=ENV if env is None else env,
                          text=True, capture_output=True, timeout=timeout)


def trace_run(*args, cwd=None, timeout=180, env=None) -> subprocess.CompletedProcess:
    return run("trace-run", *args, cwd=cwd, env=env, timeout=timeout)


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
