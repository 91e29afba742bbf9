"""How much of the CUPTI C (tracer/recorder/csrc/cupti/cupti.c and cuptirecords.c) a CPU-only run
exercises: a copy of tracer.recorder._cupti built with gcov's instrumentation runs
test_cupti_standin.py and test_cupti_standin_runs.py (the stand-in libcupti: every call, error
return, out-of-memory path and both of CUPTI's callbacks), and gcov counts the lines. At least
85%, both callbacks executed (issue 52; docs/gpu.md has the number and how to reproduce it by
hand)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from support.cupti_standin import COVERAGE_ENV, compiler
from support.paths import REPO

CSRC = REPO / "tracer" / "recorder" / "csrc" / "cupti"
SOURCES = ("cupti", "cuptitests", "cuptirecords")
MEASURED = ("cupti.c", "cuptirecords.c")
CALLBACKS = ("buffer_requested", "buffer_completed")


def build_instrumented(out: Path) -> Path:
    """The extension, compiled with --coverage into ``out`` (its .gcno and .gcda land there)."""
    include = sysconfig.get_paths()["include"]
    for name in SOURCES:
        subprocess.run([compiler(), "-c", "--coverage", "-O0", "-fPIC", "-fvisibility=hidden",
                        f"-I{include}", str(CSRC / f"{name}.c"), "-o", str(out / f"{name}.o")],
                       check=True, capture_output=True, text=True)
    module = out / "_cupti.so"
    subprocess.run([compiler(), "-shared", "--coverage", "-o", str(module),
                    *[str(out / f"{n}.o") for n in SOURCES], "-ldl", "-lpthread"],
                   check=True, capture_output=True, text=True)
    return module


def gcov_lines(out: Path) -> tuple:
    """({file: (lines run, lines)}, {function: lines run}) from gcov's summary."""
    done = subprocess.run(["gcov", "-n", "-f", "-o", str(out),
                           *[str(CSRC / name) for name in MEASURED]],
                          capture_output=True, text=True, cwd=out, check=True)
    files, functions = {}, {}
    for kind, name, pct, total in re.findall(
            r"(File|Function) '([^']+)'\nLines executed:([\d.]+)% of (\d+)", done.stdout):
        run = round(float(pct) * int(total) / 100)
        if kind == "File" and os.path.basename(name) in MEASURED:
            files[os.path.basename(name)] = (run, int(total))
        elif kind == "Function":
            functions[name] = run
    return files, functions


@pytest.mark.skipif(shutil.which("gcov") is None, reason="no gcov (gcc's) on this machine")
def test_a_cpu_only_run_covers_the_cupti_c(tmp_path):
    module = build_instrumented(tmp_path)
    env = {**os.environ, COVERAGE_ENV: str(module),
           "PYTHONPATH": os.pathsep.join([str(REPO)] + sys.path)}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          str(REPO / "tests" / "integration" / "test_cupti_standin.py"),
                          str(REPO / "tests" / "integration" / "test_cupti_standin_runs.py")],
                         capture_output=True, text=True, env=env, cwd=REPO, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    files, functions = gcov_lines(tmp_path)
    assert set(files) == set(MEASURED)
    covered = sum(run for run, _ in files.values()) / sum(total for _, total in files.values())
    print(f"gcov: {covered:.1%} of the lines of cupti.c + cuptirecords.c "
          + ", ".join(f"{name} {r}/{t}" for name, (r, t) in sorted(files.items())))
    assert covered >= 0.85, files
    assert all(functions.get(name, 0) > 0 for name in CALLBACKS), functions
