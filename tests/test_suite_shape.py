"""The test suite's own shape: every test file reads on its own. No module of tests/ imports a
test file (``test_*``), at any depth of its body; what files share lives in conftest.py or a
helper module."""
from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def imported_test_files(path: Path) -> list:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            continue
        found += [(node.lineno, name) for name in names
                  if name.removeprefix("tests.").split(".")[0].startswith("test_")]
    return found


def test_no_test_file_imports_another():
    offenders = {path.name: found for path in sorted(TESTS.rglob("*.py"))
                 if (found := imported_test_files(path))}
    assert not offenders, f"test files imported by others (move what they share to a " \
                          f"helper module or conftest.py): {offenders}"


def test_the_check_sees_an_import_of_a_test_file(tmp_path):
    sample = tmp_path / "test_sample.py"
    sample.write_text("import os\nfrom gpt_helpers import REPO\n\ndef f():\n"
                      "    from test_timeline import gpipe_two_stages\n"
                      "    import tests.test_report\n")
    assert imported_test_files(sample) == [(5, "test_timeline"), (6, "tests.test_report")]
