"""The code's shape, checked: imports flow one way (no cycles between modules nor between
packages; tracer in layers, vocab <- files <- kineto <- recorder <- the public API; viz in
layers, inputs <- analysis <- diff, whatif <- views <- render <- commands, and on tracer's
vocab, files and kineto only; instrument in two rooms, supervise <- launch; reading traces and
analysing them never imports torch or the recorder's hot path), modules stay focused and each
has its line in docs/architecture.md. The renderers' one shape is checked in
test_renderer_shape.py, what trace-run loads beside its workers in test_launch_imports.py."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import networkx as nx
from support.paths import REPO, modules

MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 80
# Documented exceptions: the recorder's hot path is one function on purpose (every call
# costs on every op).
LONG_FUNCTIONS = {("tracer/recorder/op_path.py", "on_op")}
# viz's units (module name prefixes) and their layers, lowest first (docs/architecture.md): a
# module imports from its own unit and from the layers below, never from above nor from
# another unit of its own layer (diff and whatif stay apart).
VIZ_UNITS = {
    "inputs": ("viz.run", "viz.engine", "tracer.kineto.inputs", "tracer.kineto.imported_run"),
    "analysis": ("viz.analysis",),
    "diff": ("viz.diff",),
    "whatif": ("viz.whatif",),
    "views": ("viz.views",),
    "render": ("viz.render",),
    "commands": ("viz.cli", "viz.whatif_cli"),
}
VIZ_LAYERS = (("inputs",), ("analysis",), ("diff", "whatif"), ("views",), ("render",),
              ("commands",))
# viz/analysis's rooms, in layers, lowest first (docs/architecture.md): a room imports from its
# own room and the layers below, never from one beside it nor from the top of viz/analysis (the
# run's analysis: map_reduce, rank, run_analysis, report_callgraphs), which imports them all
ANALYSIS_ROOMS = (("viz.analysis.callgraphs",), ("viz.analysis.timeline", "viz.analysis.memory"),
                  ("viz.analysis.device", "viz.analysis.crossrank"))
# tracer's rooms, lowest first (docs/architecture.md): the vocabulary, the trace files, the
# torch.profiler export reader, the recorder (its device windows read exports), and the public
# API of tracer/__init__.py on top.
TRACER_LAYERS = ("tracer.vocab", "tracer.files", "tracer.kineto", "tracer.recorder", "tracer")
# tracer/recorder's rooms, in layers, lowest first (docs/architecture.md): the ground (the
# recorder's own modules every room may use: torch bridges, the row layouts, the options), the
# hot path and the process facts, then where an op came from, its memory and its device time,
# then the frameworks' support, and on top the owner (Session and its parts, every other module
# of tracer/recorder itself, and patches/, which hooks torch into those parts). A room imports
# from itself and the layers below, never from one beside it nor from above.
RECORDER_GROUND = tuple(f"tracer.recorder.{name}" for name in (
    "compat", "user_profile", "_active", "rows", "group_names", "passthrough", "options"))
RECORDER_ROOMS = (("ground",), ("tracer.recorder.hotpath", "tracer.recorder.process"),
                  ("tracer.recorder.attribution", "tracer.recorder.memory",
                   "tracer.recorder.device"),
                  ("tracer.recorder.frameworks",), ("owner",))
# instrument's rooms, lowest first (docs/architecture.md): what watches and records the run
# beside the workers, then what launches it; a room imports from itself and the rooms below
INSTRUMENT_ROOMS = ("instrument.supervise", "instrument.launch")
# what viz may import of tracer: never the recorder, nor the API that starts it
VIZ_READS = ("tracer.vocab", "tracer.files", "tracer.kineto")



def imports(name: str, path: Path, known: dict) -> set:
    """The package modules ``name`` imports (at any depth of its body)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")
                parent = parent[:len(parent) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph() -> nx.DiGraph:
    known = modules()
    graph = nx.DiGraph()
    for name, path in known.items():
        graph.add_node(name)
        for target in imports(name, path, known):
            graph.add_edge(name, target)
    return graph


def test_no_import_cycles():
    graph = import_graph()
    # a package's __init__ re-exporting its modules is not a cycle of the modules themselves
    graph.remove_edges_from([(a, b) for a, b in list(graph.edges)
                             if b.startswith(a + ".") and (REPO / a.replace(".", "/")).is_dir()])
    cycles = list(nx.simple_cycles(graph))
    assert not cycles, f"import cycles: {cycles[:5]}"


def unit_of(module: str) -> str:
    """The package a module belongs to for the package-level checks: viz's unit
    (:data:`VIZ_UNITS`), else its top-level package; '' for a viz module of no unit."""
    if module.split(".")[0] != "viz":
        return module.split(".")[0]
    for unit, prefixes in VIZ_UNITS.items():
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return unit
    return "viz" if module == "viz" else ""


def layer_violations(graph: nx.DiGraph) -> list:
    """(importer, imported, why) of each import between viz's units that goes up a layer or
    sideways to another unit of the same layer."""
    layer = {unit: i for i, units in enumerate(VIZ_LAYERS) for unit in units}
    wrong = []
    for a, b in graph.edges:
        ua, ub = unit_of(a), unit_of(b)
        if ua == ub or ua not in layer or ub not in layer:
            continue
        if layer[ub] > layer[ua]:
            wrong.append((a, b, f"{ua} imports {ub}, a layer above it"))
        elif layer[ub] == layer[ua]:
            wrong.append((a, b, f"{ua} imports {ub}, beside it"))
    return wrong


def analysis_room(module: str) -> str:
    """The room of :data:`ANALYSIS_ROOMS` a viz.analysis module lives in; 'top' for a module of
    viz/analysis itself, '' for one in no room."""
    room = next((room for layer in ANALYSIS_ROOMS for room in layer
                 if module == room or module.startswith(room + ".")), "")
    return room or ("top" if module.count(".") <= 2 else "")


def analysis_violations(graph: nx.DiGraph) -> list:
    """(importer, imported, why) of each import between viz/analysis's rooms that goes up a
    layer, sideways to another room of the same layer, or from a room to the top."""
    layer = {room: i for i, rooms in enumerate(ANALYSIS_ROOMS) for room in rooms}
    wrong = []
    for a, b in graph.edges:
        if not (a.startswith("viz.analysis.") and b.startswith("viz.analysis")):
            continue
        ra, rb = analysis_room(a), analysis_room(b)
        if ra == rb or ra in ("top", ""):
            continue
        if rb == "top":
            wrong.append((a, b, f"{ra} imports the top of viz/analysis"))
        elif rb and layer[rb] > layer[ra]:
            wrong.append((a, b, f"{ra} imports {rb}, a layer above it"))
        elif rb and layer[rb] == layer[ra]:
            wrong.append((a, b, f"{ra} imports {rb}, beside it"))
    return wrong


def tracer_room(module: str) -> str:
    """The room of :data:`TRACER_LAYERS` a tracer module lives in."""
    return next(room for room in TRACER_LAYERS if module == room or module.startswith(room + "."))


def tracer_violations(graph: nx.DiGraph) -> list:
    """(importer, imported, why) of each import that goes up tracer's rooms, and of each viz
    import of tracer outside :data:`VIZ_READS`."""
    wrong = []
    for a, b in graph.edges:
        if not b.startswith("tracer"):
            continue
        if a.startswith("tracer"):
            ra, rb = tracer_room(a), tracer_room(b)
            if TRACER_LAYERS.index(rb) > TRACER_LAYERS.index(ra):
                wrong.append((a, b, f"{ra} imports {rb}, a room above it"))
        elif a.startswith("viz") and tracer_room(b) not in VIZ_READS:
            wrong.append((a, b, f"viz imports {tracer_room(b)}: it reads only "
                                + ", ".join(VIZ_READS)))
    return wrong


def recorder_room(module: str) -> str:
    """The room of :data:`RECORDER_ROOMS` a tracer.recorder module lives in: 'ground' for
    :data:`RECORDER_GROUND` (and the package itself, which imports nothing), 'owner' for the
    other modules of tracer/recorder itself and patches/, '' for a module of no room."""
    if module == "tracer.recorder" or module in RECORDER_GROUND:
        return "ground"
    room = next((room for layer in RECORDER_ROOMS for room in layer
                 if module == room or module.startswith(room + ".")), "")
    owner = module.count(".") == 2 or module.startswith("tracer.recorder.patches")
    return room or ("owner" if owner else "")


def recorder_violations(graph: nx.DiGraph) -> list:
    """(importer, imported, why) of each import between tracer/recorder's rooms that goes up a
    layer or sideways to another room of the same layer."""
    layer = {room: i for i, rooms in enumerate(RECORDER_ROOMS) for room in rooms}
    wrong = []
    for a, b in graph.edges:
        if not (a.startswith("tracer.recorder") and b.startswith("tracer.recorder")):
            continue
        ra, rb = recorder_room(a), recorder_room(b)
        if ra == rb or not ra or not rb:
            continue
        if layer[rb] > layer[ra]:
            wrong.append((a, b, f"{ra} imports {rb}, a layer above it"))
        elif layer[rb] == layer[ra]:
            wrong.append((a, b, f"{ra} imports {rb}, beside it"))
    return wrong


def instrument_room(module: str) -> str:
    """The room of :data:`INSTRUMENT_ROOMS` an instrument module lives in; '' for none."""
    return next((room for room in INSTRUMENT_ROOMS
                 if module == room or module.startswith(room + ".")), "")


def instrument_violations(graph: nx.DiGraph) -> list:
    """(importer, imported, why) of each import that goes up instrument's rooms."""
    wrong = []
    for a, b in graph.edges:
        ra, rb = instrument_room(a), instrument_room(b)
        if ra and rb and INSTRUMENT_ROOMS.index(rb) > INSTRUMENT_ROOMS.index(ra):
            wrong.append((a, b, f"{ra} imports {rb}, a room above it"))
    return wrong


def package_cycles(graph: nx.DiGraph) -> list:
    """Cycles of the graph of packages (viz's units, the other top-level packages)."""
    packages = nx.DiGraph()
    packages.add_edges_from((unit_of(a), unit_of(b)) for a, b in graph.edges
                            if unit_of(a) != unit_of(b))
    return list(nx.simple_cycles(packages))


def test_every_viz_module_has_its_layer():
    lost = [m for m in modules() if m.startswith("viz.") and not unit_of(m)]
    assert not lost, f"viz modules in no unit of VIZ_UNITS (give each its layer): {lost}"


def test_viz_imports_go_down_its_layers():
    wrong = layer_violations(import_graph())
    assert not wrong, "imports against viz's layers: " + "; ".join(
        f"{a} -> {b} ({why})" for a, b, why in wrong)


def test_every_analysis_module_lives_in_a_room_or_on_top():
    lost = [m for m in modules() if m.startswith("viz.analysis.") and not analysis_room(m)]
    assert not lost, f"viz.analysis modules in no room of ANALYSIS_ROOMS: {lost}"


def test_analysis_imports_go_down_its_rooms():
    wrong = analysis_violations(import_graph())
    assert not wrong, "imports against viz/analysis's rooms: " + "; ".join(
        f"{a} -> {b} ({why})" for a, b, why in wrong)


def test_the_analysis_room_checks_catch_what_they_forbid():
    """Planted: the timeline's lanes reaching up into the cross-rank matching, the device lanes
    beside them into it, the op groups into the per-rank map on top, memory beside into the
    timeline; and a room nobody listed. The top's imports of every room stay allowed, and so do
    the timeline's of the call graphs below it."""
    graph = import_graph()
    assert ("viz.analysis.timeline.rank_lanes", "viz.analysis.callgraphs.op_groups") in graph.edges
    assert ("viz.analysis.rank", "viz.analysis.device.device_lanes") in graph.edges
    planted = {("viz.analysis.timeline.lanes", "viz.analysis.crossrank.matching"),
               ("viz.analysis.device.device_lanes", "viz.analysis.crossrank.matching"),
               ("viz.analysis.callgraphs.op_groups", "viz.analysis.rank"),
               ("viz.analysis.memory.live_bytes", "viz.analysis.timeline.lanes")}
    graph.add_edges_from(planted)
    assert {(a, b) for a, b, _ in analysis_violations(graph)} == planted
    assert analysis_room("viz.analysis.predictions.step") == ""
    assert analysis_room("viz.analysis.report_callgraphs") == "top"
    assert analysis_room("viz.analysis.timeline") == "viz.analysis.timeline"


def test_tracer_imports_go_down_its_rooms():
    wrong = tracer_violations(import_graph())
    assert not wrong, "imports against tracer's rooms: " + "; ".join(
        f"{a} -> {b} ({why})" for a, b, why in wrong)


def test_every_tracer_module_lives_in_a_room():
    loose = [m for m in modules() if m.startswith("tracer.")
             and m.split(".")[1] not in ("vocab", "files", "kineto", "recorder")]
    assert not loose, f"tracer modules outside vocab/, files/, kineto/, recorder/: {loose}"


def test_every_recorder_module_lives_in_a_room():
    lost = [m for m in modules() if m.startswith("tracer.recorder.") and not recorder_room(m)]
    assert not lost, f"tracer.recorder modules in no room of RECORDER_ROOMS: {lost}"


def test_recorder_imports_go_down_its_rooms():
    wrong = recorder_violations(import_graph())
    assert not wrong, "imports against tracer/recorder's rooms: " + "; ".join(
        f"{a} -> {b} ({why})" for a, b, why in wrong)


def test_the_recorder_room_checks_catch_what_they_forbid():
    """Planted: the stack walk reaching beside it into the device windows, the clock up into
    memory recording, the HOPs support into Session, the torch bridges up into the dispatch
    mode; and a room nobody listed. Session's imports of every room, patches' of comm and the
    frameworks' of attribution stay allowed."""
    graph = import_graph()
    assert ("tracer.recorder.session", "tracer.recorder.device.kineto_windows") in graph.edges
    assert ("tracer.recorder.patches.distributed", "tracer.recorder.comm") in graph.edges
    assert ("tracer.recorder.frameworks.hops", "tracer.recorder.attribution.stacks") in \
        graph.edges
    planted = {("tracer.recorder.attribution.stacks", "tracer.recorder.device.kineto_windows"),
               ("tracer.recorder.process.clock", "tracer.recorder.memory.memory_recorder"),
               ("tracer.recorder.frameworks.hops", "tracer.recorder.session"),
               ("tracer.recorder.compat", "tracer.recorder.hotpath._mode")}
    graph.add_edges_from(planted)
    assert {(a, b) for a, b, _ in recorder_violations(graph)} == planted
    assert recorder_room("tracer.recorder.gadgets.lamp") == ""
    assert recorder_room("tracer.recorder.session") == "owner"
    assert recorder_room("tracer.recorder.patches.fsdp") == "owner"
    assert recorder_room("tracer.recorder.rows") == "ground"


def test_every_instrument_module_lives_in_a_room():
    loose = [m for m in modules() if m.startswith("instrument.") and not instrument_room(m)]
    assert not loose, f"instrument modules outside launch/, supervise/: {loose}"


def test_instrument_imports_go_down_its_rooms():
    wrong = instrument_violations(import_graph())
    assert not wrong, "imports against instrument's rooms: " + "; ".join(
        f"{a} -> {b} ({why})" for a, b, why in wrong)


def test_the_instrument_room_checks_catch_what_they_forbid():
    """Planted: the watchdog reaching up into the command line, gathering into the launch
    package; a module beside the rooms. The launch room's imports of supervise stay allowed."""
    graph = import_graph()
    assert ("instrument.launch.single", "instrument.supervise.monitor") in graph.edges
    planted = {("instrument.supervise.watchdog", "instrument.launch.command_line"),
               ("instrument.supervise.gather", "instrument.launch")}
    graph.add_edges_from(planted)
    assert {(a, b) for a, b, _ in instrument_violations(graph)} == planted
    assert instrument_room("instrument.helpers") == ""
    assert instrument_room("instrument.launch") == "instrument.launch"


def test_no_import_cycles_between_packages():
    cycles = package_cycles(import_graph())
    assert not cycles, f"import cycles between packages: {cycles[:5]}"


def test_the_layer_checks_catch_what_they_forbid():
    """The checks above, on a graph with one wrong import each: a view importing a renderer
    (up), diff importing whatif (beside), and a cycle between two packages."""
    graph = import_graph()
    graph.add_edge("viz.views.pages", "viz.render.page_writer")
    graph.add_edge("viz.diff.words", "viz.whatif.replay.models")
    assert {(a, b) for a, b, _ in layer_violations(graph)} == {
        ("viz.views.pages", "viz.render.page_writer"), ("viz.diff.words", "viz.whatif.replay.models")}
    assert package_cycles(graph)
    graph = import_graph()
    graph.add_edge("tracer.files.format", "instrument.launch.command_line")
    assert ["tracer", "instrument"] in [sorted(c, reverse=True) for c in package_cycles(graph)]
    # tracer's rooms: the trace format reaching up into the recorder, the vocabulary into the
    # files; viz reaching into the recorder, or into the API that starts it
    graph = import_graph()
    planted = {("tracer.files.format", "tracer.recorder.attribution.stacks"),
               ("tracer.vocab.ops", "tracer.files.format"),
               ("tracer.kineto.convert", "tracer.recorder.session"),
               ("viz.analysis.rank", "tracer.recorder.session"), ("viz.run", "tracer")}
    graph.add_edges_from(planted)
    assert {(a, b) for a, b, _ in tracer_violations(graph)} == planted


def test_the_flow_is_one_way():
    """tracer is the ground; viz and sample_runs sit on it; instrument on top."""
    graph = import_graph()
    layer = {"tracer": 0, "viz": 1, "sample_runs": 1, "instrument": 2}
    wrong = [(a, b) for a, b in graph.edges
             if layer[b.split(".")[0]] > layer[a.split(".")[0]]]
    assert not wrong, f"imports against the flow: {wrong}"


def test_modules_and_functions_stay_focused():
    long_modules, long_functions = [], []
    for name, path in modules().items():
        text = path.read_text()
        rel = str(path.relative_to(REPO))
        if len(text.splitlines()) > MAX_MODULE_LINES:
            long_modules.append((rel, len(text.splitlines())))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES and (rel, node.name) not in LONG_FUNCTIONS:
                    long_functions.append((rel, node.name, n))
    for path in sorted((REPO / "tracer" / "recorder" / "csrc").rglob("*.[ch]")):  # the C sources
        n = len(path.read_text().splitlines())
        if n > MAX_MODULE_LINES:
            long_modules.append((str(path.relative_to(REPO)), n))
    assert not long_modules, f"modules over {MAX_MODULE_LINES} lines: {long_modules}"
    assert not long_functions, f"functions over {MAX_FUNCTION_LINES} lines: {long_functions}"


def test_every_module_has_its_line_in_docs_architecture():
    """docs/architecture.md's tables name every module of the recorder, the analyses and the
    launcher (in backticks), so a reader finds where each piece lives."""
    text = (REPO / "docs" / "architecture.md").read_text()
    named = set(re.findall(r"`([A-Za-z_]\w*)/?`", text))
    missing = [name for name in modules()
               if name.split(".")[0] in ("tracer", "viz", "instrument") and "." in name
               and name.rsplit(".", 1)[1] not in named]
    assert not missing, f"modules docs/architecture.md does not name: {missing}"
