"""Importing paratrace to read traces loads neither torch nor the C hot path (a fresh interpreter)."""
from __future__ import annotations

import subprocess
import sys
from support.paths import REPO, modules


TORCH_AT_IMPORT = ("tracer.recorder", "instrument", "sample_runs")


def _import_all_then(code: str, before: str = "") -> subprocess.CompletedProcess:
    """A fresh interpreter that runs ``before``, imports every module but the recorder's and
    the launcher's, then runs ``code``."""
    names = sorted(m for m in modules() if not m.startswith(TORCH_AT_IMPORT))
    program = (f"import importlib, sys\n{before}"
               f"for name in {names!r}:\n"
               "    importlib.import_module(name)\n" + code)
    return subprocess.run([sys.executable, "-c", program], cwd=REPO, capture_output=True,
                          text=True, timeout=120)


def test_only_the_recorder_imports_torch_or_its_c_hot_path():
    """Every module but the recorder's and the launcher's, imported in one fresh interpreter:
    neither torch nor the recorder's C extension gets loaded (the trace files and their reader
    say nothing of the hot path; a report is made where torch is not installed)."""
    proc = _import_all_then("bad = sorted(m for m in sys.modules if m.split('.')[0] == 'torch'\n"
                            "             or m == 'tracer.recorder._hotpath')\n"
                            "assert not bad, bad[:5]\n")
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_without_graphviz_every_module_imports_and_drawing_says_so_in_one_line():
    """A machine without the graphviz Python package (the GPU machines) still imports every
    module, so it reads runs and writes summary.json; drawing a graph raises RenderError, one
    line naming the package."""
    proc = _import_all_then("from viz.render.callgraph_svg import RenderError, render_svg\n"
                            "try:\n"
                            "    render_svg('digraph { a -> b }')\n"
                            "except RenderError as exc:\n"
                            "    print(exc)\n",
                            before="sys.modules['graphviz'] = None    # import graphviz fails\n")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout == ("the graphviz Python package is not installed: "
                           "pip install graphviz\n")
