"""No module reaches another's underscore names: an attribute access ``x._name`` (not on
``self`` or ``cls``) outside the module that defines ``_name`` (assigns ``self._name``, or
defines it in a class body; the C SessionState's members, from tracer/recorder/_hotpath.pyi,
belong to Session's modules) is a reach into another part's state. Checked over tracer/, viz/
and instrument/ with ast, so a duck-typed access (``session._flusher`` in the files room) is
seen as well as a typed one.

State that Session shares on purpose with the modules that play its parts (``passthrough``,
``recording``, ``is_open``, ``in_optimizer``...: docs/recorder.md's table) has a public name;
what stays underscored is its own module's (issue 53)."""
from __future__ import annotations

import ast
from collections import defaultdict

from support.paths import REPO

ROOTS = ("tracer", "viz", "instrument")
# the modules of Session and its bases: the C SessionState's members are theirs
SESSION_MODULES = {"tracer/recorder/session.py", "tracer/recorder/op_path.py",
                   "tracer/recorder/step_windows.py"}
# torch's own private names that a paratrace class also defines (not a reach into a part)
FOREIGN = {("tracer/recorder/attribution/modules.py", "_modules"): "nn.Module's children"}


def private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def defined_names(tree: ast.Module) -> set[str]:
    """The underscore names a module defines: ``self._x = ...`` (``cls._x``), and the methods
    and attributes of its class bodies."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    names.add(item.name)
                targets = item.targets if isinstance(item, ast.Assign) else \
                    [item.target] if isinstance(item, ast.AnnAssign) else []
                names.update(t.id for t in targets if isinstance(t, ast.Name))
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
        for t in targets:
            for el in (t.elts if isinstance(t, ast.Tuple) else [t]):
                if isinstance(el, ast.Attribute) and isinstance(el.value, ast.Name) and \
                        el.value.id in ("self", "cls"):
                    names.add(el.attr)
    return {n for n in names if private(n)}


def stub_members() -> set[str]:
    """The C SessionState's underscore members, as its stub declares them."""
    tree = ast.parse((REPO / "tracer" / "recorder" / "_hotpath.pyi").read_text())
    state = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "SessionState")
    return {n.target.id for n in state.body if isinstance(n, ast.AnnAssign)
            and isinstance(n.target, ast.Name) and private(n.target.id)}


def reaches(sources: dict[str, str]) -> dict[str, set[str]]:
    """Module path -> the underscore names it reaches that only other modules define."""
    trees = {path: ast.parse(text) for path, text in sources.items()}
    owners: dict[str, set[str]] = defaultdict(set)
    for path, tree in trees.items():
        for name in defined_names(tree):
            owners[name].add(path)
    for name in stub_members():
        owners[name] |= SESSION_MODULES
    found: dict[str, set[str]] = defaultdict(set)
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and private(node.attr) and owners[node.attr] \
                    and path not in owners[node.attr] and (path, node.attr) not in FOREIGN \
                    and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                found[path].add(node.attr)
    return dict(found)


def module_sources() -> dict[str, str]:
    return {str(p.relative_to(REPO)): p.read_text()
            for root in ROOTS for p in sorted((REPO / root).rglob("*.py"))}


def test_no_module_reaches_another_modules_underscore_names():
    found = {m: sorted(names) for m, names in reaches(module_sources()).items()}
    assert not found, f"modules reaching another's underscore names (give the part a public " \
        f"interface): {found}"


def test_the_reach_check_sees_a_planted_reach():
    """Planted: the status file reading the session's flusher again, and a view reading a C
    member; a module's own names (set on self, read on another instance) stay allowed."""
    sources = module_sources()
    status, view = "tracer/files/status.py", "viz/views/failures.py"
    planted = {
        status: sources[status] + "\n\ndef peek(session):\n    return session._flusher\n",
        view: sources[view] + "\n\ndef step_of(s):\n    return s._last_event_ns\n",
        "tracer/recorder/new_part.py": "class Part:\n    def __init__(self):\n"
                                       "        self._held = 0\n\n    def same(self, other):\n"
                                       "        return other._held == self._held\n",
    }
    found = reaches({**sources, **planted})
    assert found[status] == {"_flusher"} and found[view] == {"_last_event_ns"}
    assert "tracer/recorder/new_part.py" not in found
    assert status not in reaches(sources)
