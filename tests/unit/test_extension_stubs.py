"""The ``.pyi`` stubs of the recorder's C extensions (tracer/recorder/_hotpath.pyi, _cupti.pyi)
name what the built modules export, no more and no less: the module's public names, and for each
of its classes the attributes the C type defines (methods, members, getters), so a stub cannot
drift from the C it describes."""
from __future__ import annotations

import ast

import pytest
from support.paths import REPO

EXTENSIONS = ("_hotpath", "_cupti")


def stub_names(text: str) -> tuple[set[str], dict[str, set[str]]]:
    """(the module-level names a stub declares, class -> the names its body declares)."""
    classes = {}

    def declared(body: list[ast.stmt]) -> set[str]:
        found = set()
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                found.add(node.name)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                found.add(node.target.id)
        return found
    for node in ast.parse(text).body:
        if isinstance(node, ast.ClassDef):
            classes[node.name] = {n for n in declared(node.body) if not n.startswith("__")}
    names = declared(ast.parse(text).body)
    return names, classes


def module_names(module) -> tuple[set[str], dict[str, set[str]]]:
    """(a module's public names, class -> the attributes its C type defines, dunders aside)."""
    public = {n for n in dir(module) if not n.startswith("_")}
    classes = {n: {a for a in vars(getattr(module, n)) if not a.startswith("__")}
               for n in public if isinstance(getattr(module, n), type)}
    return public, classes


def drift(stub: str, module) -> list[str]:
    """What the stub and the module disagree on, in words."""
    (names, classes), (public, types) = stub_names(stub), module_names(module)
    faults = [f"{n}: in the module, not the stub" for n in sorted(public - names)]
    faults += [f"{n}: in the stub, not the module" for n in sorted(names - public)]
    for cls in sorted(set(classes) & set(types)):
        faults += [f"{cls}.{a}: in the module, not the stub"
                   for a in sorted(types[cls] - classes[cls])]
        faults += [f"{cls}.{a}: in the stub, not the module"
                   for a in sorted(classes[cls] - types[cls])]
    return faults


@pytest.mark.parametrize("name", EXTENSIONS)
def test_the_stub_names_what_the_extension_exports(name):
    module = pytest.importorskip(f"tracer.recorder.{name}", reason=f"{name} is not built")
    stub = (REPO / "tracer" / "recorder" / f"{name}.pyi").read_text()
    assert not drift(stub, module), f"{name}.pyi against the module: {drift(stub, module)}"


def test_the_drift_check_sees_a_planted_difference():
    """Planted: a function the module lacks, a constant left out, a member renamed in a class."""
    module = pytest.importorskip("tracer.recorder._hotpath", reason="_hotpath is not built")
    stub = (REPO / "tracer" / "recorder" / "_hotpath.pyi").read_text()
    planted = stub.replace("MAX_QUEUE: int\n", "") + "\ndef later() -> None: ...\n"
    planted = planted.replace("    _last_sid: int\n", "    _last_id: int\n")
    assert drift(planted, module) == [
        "MAX_QUEUE: in the module, not the stub", "later: in the stub, not the module",
        "StackWalk._last_sid: in the module, not the stub",
        "StackWalk._last_id: in the stub, not the module"]
