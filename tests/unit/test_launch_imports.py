"""What trace-run loads and does while its workers run: no viz module beside them, and one
module of instrument that sends signals."""
from __future__ import annotations

import ast

from support.paths import modules

# the one module of instrument that sends signals with os.kill (processes.terminate ends
# processes for the watchdog and orphans alike)
SIGNALLER = "instrument.supervise.processes"


def kill_calls(text: str) -> list:
    """Lines of a module's source that call ``os.kill``."""
    return [node.lineno for node in ast.walk(ast.parse(text)) if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute) and node.func.attr == "kill"
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "os"]


def test_one_module_of_instrument_sends_signals():
    """The watchdog and orphans end processes through processes.terminate, the one
    signal-and-wait loop; no other module of instrument calls os.kill (planted: the watchdog
    calling it is found)."""
    sources = instrument_sources()
    assert kill_calls(sources[SIGNALLER])
    others = {name: kill_calls(text) for name, text in sources.items() if name != SIGNALLER}
    assert not any(others.values()), others
    planted = sources["instrument.supervise.watchdog"] + "\n\ndef end(pid):\n    os.kill(pid, 9)\n"
    assert kill_calls(planted)


# instrument's modules that run beside the workers (the monitor thread, the watchdog, the record
# of the run, the per-worker bootstrap...): they import no viz module at all, so nothing of the
# display layer is loaded while the workers run; and the functions of the others that do
# (launch: the agent runs the workers inside it). The rest of instrument imports viz only inside
# functions that run once the workers have run (the report, run.json's facts in words).
BESIDE_THE_WORKERS = ("instrument.supervise.monitor", "instrument.supervise.watchdog",
                      "instrument.supervise.run_outcome", "instrument.supervise.orphans",
                      "instrument.launch.bootstrap", "instrument.supervise.gather",
                      "instrument.launch.single")
FUNCTIONS_BESIDE_THE_WORKERS = {("instrument.launch.trace_run", "launch")}


def viz_imports(text: str) -> list:
    """(line, function, module) of each import of a viz module in a module's source;
    ``function`` is the function it sits in ('Class.method' in a class), '' when it runs at
    import time (the module's body, a class's)."""
    found = []

    def visit(node, where: str, scope: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, scope + child.name, f"{scope}{child.name}.")
                continue
            if isinstance(child, ast.ClassDef):
                visit(child, where, f"{scope}{child.name}.")
                continue
            names = [a.name for a in child.names] if isinstance(child, ast.Import) else \
                [child.module or ""] if isinstance(child, ast.ImportFrom) and not child.level \
                else []
            found.extend((child.lineno, where, n) for n in names if n.split(".")[0] == "viz")
            visit(child, where, scope)
    visit(ast.parse(text), "", "")
    return found


def instrument_viz_faults(sources: dict) -> list:
    """Each import of viz in instrument's modules (module name -> source) that loads viz when
    the module is imported, or while the workers run (:data:`BESIDE_THE_WORKERS`,
    :data:`FUNCTIONS_BESIDE_THE_WORKERS`)."""
    faults = []
    for name, text in sorted(sources.items()):
        for line, where, target in viz_imports(text):
            if not where:
                faults.append(f"{name}:{line} imports {target} when imported")
            elif name in BESIDE_THE_WORKERS or (name, where.split(".")[0]) in \
                    FUNCTIONS_BESIDE_THE_WORKERS:
                faults.append(f"{name}:{line} imports {target} in {where}, beside the workers")
    return faults


def instrument_sources() -> dict:
    return {name: path.read_text() for name, path in modules().items()
            if name.split(".")[0] == "instrument"}


def test_trace_run_loads_no_viz_module_while_the_workers_run():
    sources = instrument_sources()
    assert set(BESIDE_THE_WORKERS) <= set(sources), "a module named here is gone: rename it"
    faults = instrument_viz_faults(sources)
    assert not faults, "viz imported beside trace-run's workers: " + "; ".join(faults)


def test_the_viz_check_catches_a_planted_import():
    """Planted: viz imported at the top of the launcher, inside a watchdog function (it runs
    beside the workers), inside a method of the monitor's thread, and in launch.launch; the
    launcher's own imports after the run (the words, the report) stay allowed."""
    sources = instrument_sources()
    launch = sources["instrument.launch.trace_run"]
    call = "    say(f\"launching {describe_launch(config, target)}\")\n"
    assert call in launch
    planted = {
        "instrument.launch.command_line": "import viz.run\n"
        + sources["instrument.launch.command_line"],
        "instrument.supervise.watchdog": sources["instrument.supervise.watchdog"]
        + "\n\ndef words():\n    from viz.views import failures\n    return failures\n",
        "instrument.supervise.monitor": sources["instrument.supervise.monitor"].replace(
            "    def _run(self) -> None:\n",
            "    def _run(self) -> None:\n        from viz.views.failures import banner\n"),
        "instrument.launch.trace_run": launch.replace(
            call, "    import viz.views.failures\n" + call),
    }
    faults = instrument_viz_faults({**sources, **planted})
    assert [f.split(" in ")[-1].split(":")[0] for f in faults] == [
        "instrument.launch.command_line", "launch, beside the workers",
        "Monitor._run, beside the workers", "words, beside the workers"], faults
    assert [f.split(":")[0] for f in faults] == [
        "instrument.launch.command_line", "instrument.launch.trace_run",
        "instrument.supervise.monitor", "instrument.supervise.watchdog"]
