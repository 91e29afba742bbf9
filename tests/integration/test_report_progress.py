"""trace-report and trace-diff show a progress display on stderr when it is a terminal, and
print nothing extra when it is not (a pipe, a log file).

The commands run for real in a subprocess, once with stderr on a pseudo-terminal and once with
it on a pipe, on a constructed two-rank run with three steps (so the report recounts the
training step, draws a setup graph and writes every kind of page).
"""
from __future__ import annotations

import os
import pty
import re
import select
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support.constructed.synthetic import SyntheticRank
from support.paths import REPO

STACK = [("train.py", 12, "step", "step"), ("train.py", 30, "main", "main")]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("progress-run")
    for rank in range(2):
        r = SyntheticRank(rank, 2)
        for step in range(3):
            base = 100 * step
            r.op(base, base + 10, stack=STACK, module="Net.fc")
            r.op(base + 10, base + 15, name="aten.add.Tensor", stack=STACK, module="Net.fc")
            r.comm("all_reduce", base + 15, base + 16, base + 30, group=(0, 1), stack=STACK)
            r.next_step(base + 50)
        r.write(out / "traces")
    return out


def command(name: str) -> str:
    path = os.path.join(os.path.dirname(sys.executable), name)
    return path if os.path.exists(path) else shutil.which(name)


def env() -> dict:
    repo = str(REPO)
    return {**os.environ, "PYTHONPATH": repo, "TERM": "xterm-256color", "COLUMNS": "120",
            "OMP_NUM_THREADS": "1"}


def on_terminal(*args: str) -> tuple:
    """Run a command with stderr on a pseudo-terminal; returns (exit status, stdout, what the
    terminal received)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(list(args), stdout=subprocess.PIPE, stderr=slave, env=env())
    os.close(slave)
    screen = b""
    while True:
        ready, _, _ = select.select([master], [], [], 1.0)
        if ready:
            try:
                chunk = os.read(master, 1 << 16)
            except OSError:         # Linux: EIO once the terminal's last writer closed it
                chunk = b""
            if not chunk:
                break
            screen += chunk
        elif proc.poll() is not None:
            break
    os.close(master)
    stdout = proc.stdout.read().decode()
    return proc.wait(timeout=120), stdout, screen.decode(errors="replace")


def finished(screen: str, phase: str) -> str:
    """The count (``done/total``) a phase's line showed last."""
    plain = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", screen)
    counts = re.findall(rf"{re.escape(phase)}\s.*?(\d+/\d+)", plain)
    assert counts, f"no line for {phase!r} in:\n{plain[-2000:]}"
    return counts[-1]


def test_trace_report_shows_progress_on_a_terminal_only(run, tmp_path):
    status, stdout, screen = on_terminal(command("trace-report"), str(run), "--out",
                                         str(tmp_path / "tty"))
    assert status == 0, screen
    assert stdout == f"{tmp_path / 'tty' / 'index.html'}\n"
    graphs = len(list((tmp_path / "tty" / "callgraphs").glob("*.svg")))
    assert graphs >= 4                               # merged, setup, one per rank
    # three passes over the 2 ranks: sends, everything, the critical path's module shares
    assert finished(screen, "reading 2 traces") == "6/6"
    # each rank counted its training steps while it was read: no trace is read again
    assert "counting the training steps" not in screen
    assert finished(screen, "drawing call graphs") == f"{graphs}/{graphs}"
    assert "\u2501" in screen                        # rich's bar
    proc = subprocess.run([command("trace-report"), str(run), "--out", str(tmp_path / "pipe")],
                          capture_output=True, text=True, env=env(), timeout=120)
    assert proc.returncode == 0 and proc.stderr == ""
    assert proc.stdout == f"{tmp_path / 'pipe' / 'index.html'}\n"


def test_trace_diff_shows_progress_on_a_terminal_only(run, tmp_path):
    args = [command("trace-diff"), str(run), str(run), "--out", str(tmp_path / "diff")]
    status, stdout, screen = on_terminal(*args)
    assert status == 0, screen
    # three passes over the 4 traces of both runs: sends, everything, critical-path modules
    assert finished(screen, "reading 4 traces") == "12/12"
    assert "drawing the diff call graphs" in screen
    proc = subprocess.run(args, capture_output=True, text=True, env=env(), timeout=120)
    assert proc.returncode == 0 and proc.stderr == ""
    assert proc.stdout == stdout                     # the table and the page's path, unchanged
    assert proc.stdout.rstrip().endswith(str(tmp_path / "diff" / "diff.html"))
