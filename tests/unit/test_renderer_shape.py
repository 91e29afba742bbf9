"""Every renderer of viz/render has the one shape: a module whose one public entry point is
``render(inputs, report_dir)``, listed in its command's registry (``RENDERERS``)."""
from __future__ import annotations

import ast
import importlib

from support.paths import modules

# viz/render's renderers, grouped by command (docs/architecture.md): every module of these
# packages is a renderer, whose one public entry point is render(inputs, report_dir), listed in
# its package's registry, RENDERERS
RENDERER_PACKAGES = ("viz.render.report", "viz.render.diff", "viz.render.whatif")


def renderer_modules(package: str) -> tuple:
    """(module name -> source text, for every module of ``package`` but its __init__; the
    names of the modules its ``RENDERERS`` lists)."""
    sources = {name: path.read_text() for name, path in modules().items()
               if name.rpartition(".")[0] == package and path.name != "__init__.py"}
    registry = {m.__name__ for m in importlib.import_module(package).RENDERERS}
    return sources, registry


def renderer_faults(package: str, sources: dict, registry: set) -> list:
    """What breaks the renderer shape in ``package``: a module whose public entry points
    (functions, classes, lower-case names it binds) are not exactly ``render``, a ``render``
    that does not take (inputs, report_dir), a module its registry does not list, a registry
    entry that is not one of its modules."""
    faults = []
    for name, text in sorted(sources.items()):
        entries = {}
        for node in ast.parse(text).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                entries[node.name] = node
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, ast.AnnAssign) else []
            entries.update((t.id, t) for t in targets
                           if isinstance(t, ast.Name) and not t.id.isupper())
        public = sorted(e for e in entries if not e.startswith("_"))
        if public != ["render"]:
            faults.append(f"{name}: public entry points {public}, not exactly one `render`")
        elif isinstance(entries["render"], ast.FunctionDef):
            args = entries["render"].args
            params = [a.arg for a in args.posonlyargs + args.args]
            if len(params) != 2 or params[1] != "report_dir" or args.vararg or args.kwonlyargs \
                    or args.kwarg:
                faults.append(f"{name}: render({', '.join(params)}), not "
                              "render(inputs, report_dir)")
        else:
            faults.append(f"{name}: `render` is not a function")
        if name not in registry:
            faults.append(f"{name}: not in {package}.RENDERERS")
    faults += [f"{name}: in {package}.RENDERERS, not a module of it"
               for name in sorted(registry - set(sources))]
    return faults


def test_every_renderer_has_one_entry_point_and_is_registered():
    faults = []
    for package in RENDERER_PACKAGES:
        sources, registry = renderer_modules(package)
        assert sources, f"{package} has no renderer"
        faults += renderer_faults(package, sources, registry)
    assert not faults, "renderers off their shape: " + "; ".join(faults)


def test_the_renderer_check_catches_what_it_forbids():
    """Planted modules: one with another entry point instead of ``render``, one with a helper
    beside it, one whose ``render`` takes more, one left out of the registry."""
    package = "viz.render.report"
    sources, registry = renderer_modules(package)
    planted = {"no_render": "def write_page(analysis, report_dir):\n    return []\n",
               "helper": "TOP = 5\n\n\ndef render(report, report_dir):\n    return []\n\n\n"
                         "def build_rows(report):\n    return []\n",
               "more": "def render(report, report_dir, *, progress=None):\n    return []\n",
               "alias": "def _write(report, report_dir):\n    return []\n\n\nrender = _write\n"}
    planted = {f"{package}.{name}": text for name, text in planted.items()}
    faults = renderer_faults(package, {**sources, **planted},
                             registry | set(planted) - {f"{package}.no_render"})
    assert sorted(f.split(":")[0] for f in faults) == sorted(
        [f"{package}.no_render"] * 2 + [f"{package}.helper", f"{package}.more",
                                        f"{package}.alias"]), faults
    unlisted = f"{package}.index"
    assert renderer_faults(package, sources, registry - {unlisted}) == [
        f"{unlisted}: not in {package}.RENDERERS"]
    assert renderer_faults(package, sources, registry | {f"{package}.gone"}) == [
        f"{package}.gone: in {package}.RENDERERS, not a module of it"]
