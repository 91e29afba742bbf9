"""Where modules live and what they are called, checked: one word, one meaning (no two modules of
tracer/, viz/ or instrument/ share a file name, ``__init__.py`` aside), and no folder holds more
than 15 modules flat (docs/architecture.md). The pairs and folders other work is still moving
are listed here by their exact paths, each with who moves it; nothing else is let through."""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from support.paths import REPO

ROOTS = ("tracer", "viz", "instrument")
MOST_FLAT = 15
# name -> the exact paths sharing it that issue 53's other parts rename (an entry lets that set
# of paths through, no other)
SHARED_NAMES: dict = {}
# folder -> why it may hold more than MOST_FLAT modules flat, for now
CROWDED: dict = {}


def module_paths(roots=ROOTS) -> list:
    """Every module file of ``roots``, as paths from the repository's root."""
    return sorted(str(p.relative_to(REPO)) for root in roots for p in (REPO / root).rglob("*.py"))


def shared_names(paths: list) -> dict:
    """File name -> the paths bearing it, for each name two modules or more bear (not
    ``__init__.py``) whose paths :data:`SHARED_NAMES` does not list exactly."""
    by_name = defaultdict(set)
    for path in paths:
        by_name[Path(path).name].add(path)
    return {name: sorted(found) for name, found in sorted(by_name.items())
            if len(found) > 1 and name != "__init__.py" and SHARED_NAMES.get(name) != found}


def crowded_folders(paths: list) -> dict:
    """Folder -> how many modules it holds flat (``__init__.py`` aside), for each folder over
    :data:`MOST_FLAT` that :data:`CROWDED` does not name."""
    flat = defaultdict(int)
    for path in paths:
        if Path(path).name != "__init__.py":
            flat[str(Path(path).parent)] += 1
    return {folder: n for folder, n in sorted(flat.items())
            if n > MOST_FLAT and folder not in CROWDED}


def test_no_two_modules_share_a_name():
    shared = shared_names(module_paths())
    assert not shared, f"module names borne twice (rename one side): {shared}"


def test_no_folder_holds_more_than_15_modules_flat():
    crowded = crowded_folders(module_paths())
    assert not crowded, f"folders of more than {MOST_FLAT} modules flat (give them rooms): " \
        f"{crowded}"


def test_the_checks_see_a_planted_name_and_a_planted_crowd():
    """Planted: a second graph.py beside viz/whatif/replay/graph.py, two memory.py in two rooms,
    and 16 modules in one folder; 15 stay allowed, and so does __init__.py."""
    paths = module_paths()
    assert shared_names(paths + ["viz/diff/graph.py"]) == {
        "graph.py": ["viz/diff/graph.py", "viz/whatif/replay/graph.py"]}
    assert shared_names(paths + ["viz/analysis/memory.py"]) == {}
    assert set(shared_names(paths + ["viz/analysis/memory.py", "instrument/memory.py"])) == {
        "memory.py"}
    room = [f"viz/hall/m{i}.py" for i in range(MOST_FLAT)] + ["viz/hall/__init__.py"]
    assert crowded_folders(paths + room) == {}
    assert crowded_folders(paths + room + ["viz/hall/one_more.py"]) == {"viz/hall": 16}
