"""viz/whatif's rooms (docs/architecture.md), checked: every module of viz/whatif lives in a room
but the entry points, and a room imports only the rooms listed before it (no two rooms import
each other), with planted faults."""
from __future__ import annotations

import ast

from support.paths import REPO

WHATIF = REPO / "viz" / "whatif"
# lowest first: a room imports only rooms before it
ROOMS = ("replay", "reference_gpt", "recorded", "edits", "memory", "pipeline")
ENTRY_POINTS = {"__init__.py", "model_targets.py", "model_predict.py"}


def room_imports() -> set:
    """(importing room, imported room) of every import between two rooms of viz/whatif."""
    found = set()
    for path in sorted(WHATIF.rglob("*.py")):
        parts = path.relative_to(WHATIF).parts
        if len(parts) < 2:
            continue
        room = parts[0]
        package = ["viz", "whatif", *parts[:-1]]
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                base = package[:len(package) - node.level + 1] + (node.module or "").split(".")
            else:
                base = (node.module or "").split(".")
            if base[:2] == ["viz", "whatif"] and len(base) > 2 and base[2] != room:
                found.add((room, base[2]))
    return found


def wrong_way(imports: set) -> set:
    """The imports of a room from a room not before it (or from no room)."""
    return {(a, b) for a, b in imports
            if a not in ROOMS or b not in ROOMS or ROOMS.index(b) >= ROOMS.index(a)}


def test_every_module_lives_in_a_room_but_the_entry_points():
    flat = {p.name for p in WHATIF.glob("*.py")}
    assert flat == ENTRY_POINTS
    assert sorted(p.name for p in WHATIF.iterdir() if p.is_dir() and p.name != "__pycache__") \
        == sorted(ROOMS)
    assert all((WHATIF / room / "__init__.py").is_file() for room in ROOMS)


def test_rooms_import_only_the_rooms_before_them():
    imports = room_imports()
    assert ("pipeline", "memory") in imports and ("edits", "replay") in imports   # it sees them
    assert not wrong_way(imports)


def test_the_room_check_catches_a_planted_import():
    """Planted: the replay reaching up into the pipeline, the edits into memory (after them)."""
    planted = {("replay", "pipeline"), ("edits", "memory")}
    assert wrong_way(room_imports() | planted) == planted
