"""The test suite's own shape, and the repository's: every test file reads on its own. No
module of tests/ imports a test file (``test_*``), at any depth of its body; what files share
lives in conftest.py or tests/support, once. Test files live in tests/unit (no process
started) or tests/integration. The repository cites no document it does not contain."""
from __future__ import annotations

import ast
import re
from pathlib import Path

from support.paths import REPO, TESTS

# what tests/support defines once: a test file that binds one of these names at module level
# writes it again
SHARED_NAMES = {"REPO", "TESTS", "SCRIPTS", "ASSETS", "ENV", "CPU_ONLY", "trace_run",
                "line_of", "script_line", "free_port"}
# the documents of the planning folder beside the repository, which users do not have
OUTSIDE = re.compile(r"(?<![\w.-])(?:\.\./)?" + "shared" + r"/(?:[A-Z]+\.md|fixtures|seeds|hooks)"
                     r"|(?<![\w/.])(?:ORACLES|DESIGN|STYLE)\.md")


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


def test_every_test_file_is_a_unit_or_an_integration_test():
    stray = sorted(str(p.relative_to(TESTS)) for p in TESTS.rglob("test_*.py")
                   if p.parent.name not in ("unit", "integration")
                   and "scripts" not in p.relative_to(TESTS).parts)
    assert not stray, f"test files outside tests/unit and tests/integration: {stray}"
    helpers = sorted(str(p.relative_to(TESTS)) for folder in ("unit", "integration")
                     for p in (TESTS / folder).glob("*.py")
                     if not p.name.startswith("test_") and p.name != "conftest.py")
    assert not helpers, f"helpers belong in tests/support: {helpers}"


def module_bindings(path: Path) -> set:
    bound = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.Assign):
            bound |= {n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return bound


def test_shared_helpers_are_written_once_in_support():
    again = {str(p.relative_to(TESTS)): sorted(found) for folder in ("unit", "integration")
             for p in sorted((TESTS / folder).glob("test_*.py"))
             if (found := module_bindings(p) & SHARED_NAMES)}
    assert not again, f"defined again outside tests/support (import it from there): {again}"


def outside_references(text: str) -> list:
    return [m.group(0) for m in OUTSIDE.finditer(text)]


def test_the_repository_cites_only_what_it_contains():
    skip = {".git", "__pycache__", "build", "assets", ".pytest_cache"}
    found = {}
    for path in REPO.rglob("*"):
        name = str(path.relative_to(REPO))
        if skip & set(path.relative_to(REPO).parts) or name.endswith(".egg-info"):
            continue
        if path.suffix not in (".py", ".md", ".sh", ".c", ".h", ".html", ".txt", ".ini",
                               ".toml", ".cfg", ".dot") or not path.is_file():
            continue
        hits = outside_references(path.read_text(errors="replace"))
        if hits:
            found[name] = hits
    assert not found, f"references to documents the repository does not hold: {found}"


def test_the_check_sees_references_outside_the_repository():
    folder, oracles = "sha" + "red/", "ORACLES" + ".md"
    assert outside_references(f"see ../{folder}fixtures/gpu-h100 and {folder}{oracles}; "
                              "DESIGN" + ".md's contract") == [
        f"../{folder}fixtures", folder + oracles, "DESIGN" + ".md"]
    assert outside_references("docs/oracles.md, tests/assets/gpu-h100, a shared/ folder, "
                              "shared-memory") == []
