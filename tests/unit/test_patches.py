"""Every patch into torch and os lives in tracer/recorder/patches and is undone when the trace
ends: the patched attributes are torch's own objects again (owned or inherited as before), the
hooks and the import hook are gone, and no other module of the recorder assigns an attribute of
torch or os (an AST scan, shown to fail on injected assignments)."""
from __future__ import annotations

import ast

import pytest

from tracer.recorder.patches import Patches
from support.paths import REPO


# ---------------------------------------------------------------------------- the mechanism
class _Base:
    def run(self):
        return "base"


class _Own(_Base):
    def run(self):
        return "own"


class _Inherits(_Base):
    pass


def _tagged(original):
    def run(self):
        return "patched " + original(self)
    return run


def test_undo_puts_back_an_owned_attribute_and_removes_an_inherited_ones_override():
    own, base = _Own.__dict__["run"], _Base.__dict__["run"]
    patches = Patches()
    patches.wrap(_Own, "run", _tagged)
    patches.wrap(_Inherits, "run", _tagged)
    assert (_Own().run(), _Inherits().run()) == ("patched own", "patched base")
    assert "run" in vars(_Inherits)
    assert patches.replaced() == [(_Own, "run"), (_Inherits, "run")]
    patches.undo()
    assert _Own.__dict__["run"] is own and _Inherits.run is base
    assert "run" not in vars(_Inherits)       # inherited again, not a copy of the base's
    assert patches.replaced() == []


def test_undo_runs_in_reverse_order_and_leaves_a_later_replacement_alone():
    order, own = [], _Own.__dict__["run"]
    patches = Patches()
    patches.on_undo(lambda: order.append("first"))
    patches.wrap(_Own, "run", _tagged)
    patches.on_undo(lambda: order.append("last"))
    theirs = _tagged(_Own.run)           # someone wraps ours while we record
    _Own.run = theirs
    try:
        patches.undo()
        assert order == ["last", "first"]
        assert _Own.__dict__["run"] is theirs    # theirs to undo: dropping it would lose it
    finally:
        _Own.run = own


def test_a_missing_attribute_or_owner_patches_nothing():
    patches = Patches()
    assert patches.wrap(_Base, "absent", _tagged) is None
    assert patches.wrap(None, "run", _tagged) is None
    assert patches.replaced() == []


# ---------------------------------------------------------------------------- the scan
ROOTS = ("torch", "os")


def _refers(node, bound: set) -> bool:
    """Whether ``node`` is torch or os, or reached from them: a bound name, an attribute of
    one, ``getattr`` of one, or a tuple of them (``for module in (c10d, dist)``)."""
    if isinstance(node, ast.Name):
        return node.id in bound
    if isinstance(node, (ast.Attribute, ast.Subscript)):
        return _refers(node.value, bound)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
            node.func.id == "getattr" and node.args:
        return _refers(node.args[0], bound)
    if isinstance(node, (ast.Tuple, ast.List)):
        return any(_refers(e, bound) for e in node.elts)
    return False


def _names(target) -> list:
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for e in target.elts for n in _names(e)]
    return []


def _bound(tree) -> set:
    """Names that hold torch, os or something reached from them, anywhere in the module."""
    bound = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bound |= {a.asname or a.name.split(".")[0] for a in node.names
                      if a.name.split(".")[0] in ROOTS}
        elif isinstance(node, ast.ImportFrom) and not node.level and \
                (node.module or "").split(".")[0] in ROOTS:
            bound |= {a.asname or a.name for a in node.names}
    while True:
        more = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and _refers(node.value, bound):
                more |= {n for t in node.targets for n in _names(t)}
            elif isinstance(node, (ast.For, ast.comprehension)) and _refers(node.iter, bound):
                more |= set(_names(node.target))
        if more <= bound:
            return bound
        bound |= more


def torch_assignments(source: str) -> list:
    """Lines that assign or delete an attribute of torch or os (or of what is reached from
    them), by statement or by setattr / delattr."""
    tree = ast.parse(source)
    bound = _bound(tree)
    found = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else \
            [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
        flat = []
        while targets:
            t = targets.pop()
            if isinstance(t, (ast.Tuple, ast.List)):
                targets.extend(t.elts)
            else:
                flat.append(t)
        if any(isinstance(t, ast.Attribute) and _refers(t.value, bound) for t in flat):
            found.append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and \
                node.func.id in ("setattr", "delattr") and node.args and \
                _refers(node.args[0], bound):
            found.append(node.lineno)
    return sorted(found)


def test_no_module_but_tracer_patches_assigns_an_attribute_of_torch_or_os():
    found = {}
    for path in sorted((REPO / "tracer").rglob("*.py")):
        if "patches" in path.relative_to(REPO / "tracer").parts:
            continue
        lines = torch_assignments(path.read_text())
        if lines:
            found[str(path.relative_to(REPO))] = lines
    assert found == {}


@pytest.mark.parametrize("source", [
    "import os\nos._exit = print",
    "import torch.distributed as dist\ndist.init_process_group = print",
    "import torch\n_C = torch._C\n_C._distributed_c10d.Work.wait = print",
    "import torch\nwork = getattr(torch._C._distributed_c10d, 'Work')\nwork.wait = print",
    "from torch.utils import checkpoint as c\nsetattr(c, '_CheckpointFrame', object)",
    "import torch.distributed as dist\nfor m in (dist,):\n    setattr(m, 'x', 1)",
    "def f():\n    from torch.nn.parallel import DistributedDataParallel as DDP\n"
    "    DDP.__init__ = print",
    "import torch\ndel torch.autograd._make_grads",
    "import torch\ntorch.x, y = 1, 2",
])
def test_the_scan_finds_an_injected_assignment(source):
    assert torch_assignments(source), source


@pytest.mark.parametrize("source", [
    "import torch\nclass M:\n    def f(self):\n        self.x = torch.ones(1)",
    "import torch\ndef f(ops):\n    for op in ops:\n        op.op = torch.add",
    "import torch\ndef f(p2p):\n    setattr(p2p, '_phase', 1)",
    "import os\nx = os.getpid()",
])
def test_the_scan_leaves_other_assignments_alone(source):
    assert torch_assignments(source) == []


def test_the_scan_finds_an_assignment_injected_into_a_recorder_module():
    text = (REPO / "tracer" / "recorder" / "op_path.py").read_text()     # it imports torch
    assert torch_assignments(text) == []
    injected = text + "\n\ndef _sneak():\n    torch.autograd._make_grads = None\n"
    assert torch_assignments(injected) == [len(injected.splitlines())]
