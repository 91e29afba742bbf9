"""scripts/compat.sh's choice of interpreter for a compatibility venv: a pyenv shim on PATH
for a version pyenv has not made active fails to run, so the script must try the next one
(pyenv's own install of that version) rather than give the venv up. On a fresh machine every
venv is made this way."""
from __future__ import annotations

import os
import subprocess
import sys

from support.paths import REPO


def _find_python(version: str, path: str, pyenv_root: str) -> subprocess.CompletedProcess:
    script = (REPO / "scripts" / "compat.sh").read_text()
    start = script.index("find_python() {")
    body = script[start:script.index("\n}\n", start) + 3]
    return subprocess.run(["bash", "-c", body + f'\nfind_python {version}'], capture_output=True,
                          text=True, env={"PATH": path, "PYENV_ROOT": pyenv_root,
                                          "HOME": os.environ.get("HOME", "/tmp")})


def test_a_shim_that_does_not_run_is_passed_over_for_pyenvs_install(tmp_path):
    shims, root = tmp_path / "shims", tmp_path / "pyenv"
    shims.mkdir()
    shim = shims / "python3.99"
    shim.write_text("#!/bin/sh\necho 'pyenv: python3.99: command not found' >&2\nexit 127\n")
    shim.chmod(0o755)
    installed = root / "versions" / "3.99.1" / "bin"
    installed.mkdir(parents=True)
    (installed / "python3.99").symlink_to(sys.executable)
    path = f"{shims}:/usr/bin:/bin"
    found = _find_python("3.99", path, str(root))
    assert found.returncode == 0 and found.stdout.strip() == str(installed / "python3.99")
    # a shim that runs is taken first; no interpreter at all is a failure
    (installed / "python3.99").unlink()
    shim.unlink()
    shim.symlink_to(sys.executable)
    assert _find_python("3.99", path, str(root)).stdout.strip() == str(shim)
    shim.unlink()
    assert _find_python("3.99", path, str(root)).returncode == 1
