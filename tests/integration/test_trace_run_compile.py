"""trace-run's --compile reaches every rank's recorder (real launches)."""
from __future__ import annotations

import json
import os
import pytest
from support.paths import REPO


COMPILED_SCRIPT = """
import json, sys, torch
import torch._dynamo.utils as du
f = torch.compile(lambda x: torch.relu(x) * 2, backend="eager")
f(torch.ones(4))
print(json.dumps({"graphs": du.counters["stats"]["unique_graphs"]}))
"""


@pytest.mark.parametrize("flag, mode, graphs", [([], "compiled", 1),
                                                (["--compile-eagerly"], "eager", 0)])
def test_compile_eagerly_reaches_the_recorder_of_every_rank(tmp_path, flag, mode, graphs):
    """trace-run's --compile-eagerly goes through worker_args and the bootstrap to
    tracer.trace(compiled=...): the trace says which, and Dynamo compiles nothing under it."""
    import subprocess
    import sys

    import tracer
    from instrument.launch.command_line import Target, build_parser, worker_args
    script = tmp_path / "compiled.py"
    script.write_text(COMPILED_SCRIPT)
    args = build_parser().parse_args([*flag, str(script)])
    argv = worker_args(args, str(tmp_path / "run"), Target(str(script), None, []))
    assert ("--compile-eagerly" in argv) == bool(flag)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.run([sys.executable, *argv], env=env, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"graphs": graphs}
    trace = tracer.load(tmp_path / "run" / "traces" / "rank-0.arrow")
    assert trace.meta["options"]["compiled"] == mode
