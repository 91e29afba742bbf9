"""Source pages read only the recording's own files: a file's text is shown where the file at
the recorded path has the content hash the recorder stored (``sources`` in the trace's
metadata), with where it was found; nothing of a local file a foreign trace names; nothing at
all with --no-source. Traces are constructed (constructed.synthetic) around real files in tmp_path;
the recorder's side (the hashes of a real run) is checked in test_trace_run_exits.py.
"""
from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest

from support.constructed.synthetic import SyntheticRank

SECRET = "TOKEN = 'hunter2-do-not-share'\n\n\ndef train():\n    return TOKEN\n"


def report(run: Path, *flags) -> subprocess.CompletedProcess:
    command = shutil.which("trace-report")
    assert command, "trace-report is not installed"
    return subprocess.run([command, str(run), *flags], capture_output=True, text=True,
                          timeout=240)


def a_run(tmp_path: Path, file: Path, sources: dict) -> Path:
    """One rank whose ops were issued by ``train`` in ``file`` (line 5), with ``sources`` as
    its recorded metadata."""
    r = SyntheticRank(0, 1, meta={"sources": sources})
    for step in range(2):
        r.op(10 * step, 10 * step + 5, stack=[(str(file), 5, "train", "train")])
        r.next_step(10 * step + 8)
    run = tmp_path / "run"
    r.write(run / "traces")
    return run


def recorded(file: Path, root: str, under: Path) -> dict:
    data = file.read_bytes()
    return {str(file): {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data),
                        "root": root, "under": str(under)}}


def page_of(run: Path, name: str) -> str:
    (page,) = [p for p in (run / "source").iterdir() if p.name.endswith(f"{name}.html")]
    return page.read_text()


@pytest.fixture
def secret(tmp_path) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    path = home / "secret.py"
    path.write_text(SECRET)
    return path


@pytest.mark.parametrize("case, why", [
    ("no hash", "the recording holds no content hash of this file"),
    ("another hash", "the file here is not the one the recording saw (its content hash "
                     "differs): it changed since the run"),
])
def test_a_local_file_a_foreign_trace_names_stays_out_of_the_report(tmp_path, secret, case,
                                                                    why):
    forged = {} if case == "no hash" else {str(secret): {
        "sha256": hashlib.sha256(b"what the other machine had").hexdigest(),
        "size": len(SECRET), "root": "cwd", "under": "/"}}
    run = a_run(tmp_path, secret, forged)
    proc = report(run)
    assert proc.returncode == 0, proc.stderr
    for page in run.rglob("*.html"):
        assert "hunter2" not in page.read_text(), page
    text = page_of(run, "secret.py")
    assert f"Text not shown: {why}" in text
    assert "secret.py:4" not in "".join(p.read_text() for p in run.rglob("*.svg")), \
        "the def line was read from the file"


def test_a_file_with_the_recorded_hash_is_shown_with_where_it_was_found(tmp_path):
    """A package outside the run's directory (site-packages, the model's code for a
    frameworks): shown, with the sys.path entry it was imported from."""
    site = tmp_path / "site-packages"
    (site / "pkg").mkdir(parents=True)
    model = site / "pkg" / "model.py"
    model.write_text(SECRET.replace("hunter2-do-not-share", "fine-to-show"))
    run = a_run(tmp_path, model, recorded(model, "path", site))
    assert report(run).returncode == 0
    text = page_of(run, "model.py")
    assert f"under the directory it was imported from (sys.path) {site}, as pkg/model.py" in text
    assert "fine-to-show" in text and "Text not shown" not in text
    # its definition line comes from the file: the call graph names train at line 4, its def
    assert "model.py:4" in (run / "callgraphs" / "all.svg").read_text()
    # edited since the run: no longer shown, and said so
    model.write_text(model.read_text() + "# edited\n")
    assert report(run).returncode == 0
    assert "it changed since the run" in page_of(run, "model.py")


def test_no_source_reads_no_file_at_all(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    mine = home / "train.py"
    mine.write_text(SECRET)
    run = a_run(tmp_path, mine, recorded(mine, "cwd", home))
    proc = report(run, "--no-source")
    assert proc.returncode == 0, proc.stderr
    assert "Text not shown: source text left out (--no-source)." in page_of(run, "train.py")
    for page in run.rglob("*"):
        if page.is_file() and page.suffix in (".html", ".svg", ".json"):
            assert "hunter2" not in page.read_text(), page
