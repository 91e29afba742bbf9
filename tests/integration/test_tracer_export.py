"""torch.export under the recorder: its tracing runs on fake tensors with symbolic sizes, under a
FakeTensorMode. Nothing runs there, so nothing is recorded, and the recorder reads no symbolic
size: reading one guards on it, and export then failed with "Constraints violated" (on the
Python hot path: "unhashable type: non-nested SymInt"). The exported program's real calls are
recorded as ops. pipeline() traces with export the same way."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import Counter

import pytest

SCRIPT = '''
import sys, torch, tracer
from torch.export import Dim, export
class M(torch.nn.Module):
    def __init__(self):
        super().__init__(); self.fc = torch.nn.Linear(4, 4)
    def forward(self, x):
        return torch.relu(self.fc(x))
with tracer.trace(sys.argv[1], clock_sync=False, device_time=False):
    ep = export(M(), (torch.randn(3, 4),), dynamic_shapes={"x": {0: Dim("batch")}})
    with tracer.annotate("run"):
        ep.module()(torch.randn(5, 4))            # the batch size stayed dynamic
'''


@pytest.mark.parametrize("pure_python", ["0", "1"])
def test_export_with_dynamic_shapes_traces_and_only_the_real_call_is_recorded(tmp_path,
                                                                               pure_python):
    import tracer
    env = dict(os.environ, PARATRACE_PURE_PYTHON=pure_python, CUDA_VISIBLE_DEVICES="")
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    trace = tracer.load(tmp_path / "rank-0.arrow")
    records = trace.records()
    shapes = trace.dictionary("shapes")
    # no recorded op has a symbolic size (s0, s77...): every size is a number
    sizes = [size for text in shapes for tensor in re.findall(r"\[([^\[\]]*)\]", text)
             for size in tensor.split(",") if size]
    assert sizes and all(size.isdigit() for size in sizes), shapes
    ran = Counter(e["op"] for e in records if any(a["label"] == "run" for a in e["annotation"])
                  and e["op"] != "paratrace::annotation")
    assert ran["aten.relu.default"] == 1
    assert ran["aten.addmm.default"] + ran["aten.linear.default"] >= 1
    # what export traced on fake tensors was not recorded: no relu outside the real call
    assert sum(e["op"] == "aten.relu.default" for e in records) == 1
