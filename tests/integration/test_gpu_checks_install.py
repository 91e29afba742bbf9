"""scripts/gpu_checks.sh installs with no package index and no pip install at all (a GPU machine
here has no network, and its setuptools' develop command tries to fetch setuptools): a copy of
the checkout, its ``install`` part with PIP_NO_INDEX=1, then the launchers it made run that copy."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from support.paths import REPO



def checkout_copy(dest: Path) -> Path:
    """The files git knows of (tracked and untracked, not ignored), without built extensions."""
    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO,
                            capture_output=True, text=True, check=True).stdout.split("\n")
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


def test_the_install_part_builds_in_place_and_makes_the_launchers(tmp_path):
    copy = checkout_copy(tmp_path / "repo")
    out = tmp_path / "out"
    env = dict(os.environ, PIP_NO_INDEX="1", CUDA_VISIBLE_DEVICES="")
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(["bash", "scripts/gpu_checks.sh", "install", str(out)], cwd=copy,
                          env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "summary.txt").read_text().split("\n")[:2] == ["install rc=0", "versions rc=0"]
    versions = (out / "versions.txt").read_text()
    # the copy's package, not the one pip installed from the checkout
    assert f"paratrace {copy}\n" in versions
    assert "trace-run launcher ok" in versions
    if sys.version_info >= (3, 11) and shutil.which("gcc"):
        built = list((copy / "tracer" / "recorder").glob("_hotpath*.so"))
        assert "hot_path c" in versions and built
    names = sorted(p.name for p in (out / "bin").iterdir())
    assert names == ["trace-diff", "trace-report", "trace-run", "trace-whatif"]
    # a launcher runs the copy's code: trace-run's usage error for a missing script
    run = subprocess.run([str(out / "bin" / "trace-run"), "--no-launcher",
                          str(tmp_path / "absent.py")], cwd=copy, env=env, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode != 0 and "absent.py" in run.stderr and "Traceback" not in run.stderr
