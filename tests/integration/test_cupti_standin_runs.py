"""The recorder on a stand-in libcupti, each in a process of its own, on the CPU torch (no GPU):
buffers another profiler allocated are left to it, and a whole trace records its kernels through
tracer/recorder/csrc/cupti/cupti.c as on a GPU (the module's own paths, in this process:
test_cupti_standin.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from support import cupti_records as rec
from support.cupti_standin import build, cupti_module
from support.paths import REPO, TESTS

if cupti_module() is None:
    pytest.skip("the _cupti extension is not built (no compiler)", allow_module_level=True)

from tracer.files import rundir  # noqa: E402  (after the coverage build is installed)
from tracer.files.device_format import read_device  # noqa: E402
from tracer.recorder.device import cupti_direct as device_direct  # noqa: E402


@pytest.fixture(scope="module")
def lib_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("standin")


@pytest.fixture(scope="module")
def standin_path(lib_dir) -> str:
    """The stand-in libcupti, built."""
    return str(build(lib_dir))


FOREIGN_SCRIPT = """
import json, sys
sys.path.insert(0, {tests!r})
from support.cupti_standin import StandIn, cupti_module
cupti = cupti_module()
for call in (lambda: cupti.start(1 << 20, 0), cupti.clock):    # a fresh process: no library
    try:
        call()
        raise SystemExit("ran without a libcupti")
    except RuntimeError as exc:
        assert str(exc) == "libcupti is not loaded", exc
assert cupti.flush(True) is None and cupti.stop() is None and not cupti.own_clock()
standin = StandIn({path!r})
standin.reset()
cupti.load(standin.path)
from tracer.files import rundir
from tracer.files.device_format import read_device
from tracer.recorder.device import cupti_direct as device_direct
recorder = device_direct.DirectDeviceRecorder({out!r}, 0, [], cupti, 130001, standin.path)
assert recorder.start()
t = int(standin.now())
for round in range(2):
    # CUPTI hands this module a buffer another profiler allocated, then one of its own
    standin.kernel(b"theirs", t, t + 1)
    standin.deliver_foreign()
    standin.kernel(b"ours", t + 2, t + 3)
    standin.deliver()
    recorder.write_pending()
import ctypes
kind = ctypes.cast(standin.lib.standin_foreign_buffer(), ctypes.POINTER(ctypes.c_uint32))[0]
recorder.close()
records, _, problem = read_device(rundir.device_file({out!r}, 0))
print(json.dumps({{"names": [records.names[i] for i in records.name], "problem": problem,
                   "meta": recorder.meta(), "kind_left": kind,
                   "foreign": standin.count("foreign"),
                   "out": cupti.counters()["buffers_out"]}}))
"""


def test_buffers_another_profiler_allocated_are_left_to_it_counted_and_said_once(standin_path,
                                                                               tmp_path):
    # in a process of its own: freeing a buffer this module did not allocate (as it did
    # before) aborts the process
    out = tmp_path / "traces"
    out.mkdir()
    script = FOREIGN_SCRIPT.format(tests=str(TESTS), path=standin_path, out=str(out))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                              [str(REPO)] + sys.path)})
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["foreign"] == 2 and got["kind_left"] == rec.KIND["kernel"]   # not freed, as was
    assert got["names"] == ["ours", "ours"] and got["problem"] is None     # theirs: unread
    assert got["meta"]["foreign_buffers"] == 2 and got["out"] == 0
    assert got["meta"]["error"] == device_direct.FOREIGN and got["meta"]["errors"] == 1
    assert done.stderr.count(device_direct.FOREIGN) == 1


TRACE_SCRIPT = """
import json, sys, threading
sys.path.insert(0, {tests!r})
from support.cupti_standin import StandIn, cupti_module
cupti_module()
standin = StandIn({path!r})      # mapped, as torch's CUDA build maps its libcupti
standin.reset()
import torch
import tracer
from tracer.recorder.device import cupti_direct as device_direct
from tracer.recorder import session as session_module
session_module.cuda_in_use = lambda: True
if device_direct.libcupti_path() != {path!r}:
    # a CUDA build of torch mapped its own libcupti too (the compatibility venvs): this one
    device_direct.libcupti_path = lambda: {path!r}
launches = []


@torch.library.custom_op("standin_test::gpu_like", mutates_args=())
def gpu_like(x: torch.Tensor) -> torch.Tensor:
    # a launch on this thread, then its kernel, on the clock CUPTI stamps records with
    t, corr = int(standin.now()), len(launches) + 1
    if standin.call(2, "cudaLaunchKernel_v7000", t, t + 1_000,
                    threading.get_ident() & 0xFFFFFFFF, corr=corr):
        standin.kernel(b"standin_gpu_kernel", t + 2_000, t + 7_000, corr=corr)
        launches.append(corr)
    standin.call(2, "cudaGetDevice_v3020", t, t + 10, 1)       # never enabled
    return x.clone()


gpu_like.register_fake(lambda x: torch.empty_like(x))
gpu_like.register_autograd(lambda ctx, grad: grad)
model = torch.nn.Linear(8, 8)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
with tracer.trace({out!r}, steps="1-2"):
    for _ in range(4):
        gpu_like(gpu_like(model(torch.randn(4, 8)))).sum().backward()
        opt.step()
        opt.zero_grad()
print(json.dumps({{"launches": len(launches), "suppressed": standin.count("suppressed"),
                   "on_worker": standin.count("on_worker"),
                   "completed": standin.count("completed")}}))
"""


def test_a_trace_on_the_cpu_torch_records_through_the_c_module_and_a_libcupti(lib_dir,
                                                                             tmp_path):
    # the whole path in a process of its own, as on a GPU: device_direct finds the stand-in in
    # the process's mappings, loads it, starts CUPTI at the first recorded op, stops it when
    # recording pauses, flushes at the close; each kernel lands on the op that launched it
    import tracer
    from viz.analysis.device.gpu_attribution import attribute
    from viz.render.summary_schema import device_json
    path = build(lib_dir, libcupti=True)
    out = str(tmp_path / "run")
    done = subprocess.run(
        [sys.executable, "-c", TRACE_SCRIPT.format(tests=str(TESTS), path=str(path), out=out)],
        capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO)] + sys.path)})
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    # steps 1 and 2 launched twice each; the other steps' launches found CUPTI off, and every
    # cudaGetDevice did (8 of them)
    assert got["launches"] == 4 and got["suppressed"] == 4 + 8
    assert got["completed"] >= 1 and got["on_worker"] == got["completed"]
    trace = tracer.load(rundir.trace_file(out, 0))
    meta = trace.meta["device_time"]
    assert (meta["source"], meta["cupti_version"], meta["clock"]) == ("cupti-direct", 130001,
                                                                      "unix")
    assert (meta["error"], meta["rows_lost"], meta["records_dropped"],
            meta["foreign_buffers"]) == (None, 0, 0, 0)
    records, _, problem = read_device(rundir.device_file(out, 0))
    assert problem is None and len(records) == 8 and int(records.is_launch.sum()) == 4
    assert sorted(records.names[i] for i in records.name) == \
        ["cudaLaunchKernel"] * 4 + ["standin_gpu_kernel"] * 4
    dev = attribute(trace, records)
    summary = device_json(dev.summary(trace.dictionary("op"), trace.col("op")))
    assert summary["activities"] == summary["attributed"] == 4
    assert summary["attributed_by"]["inside_an_event"] == 4
    assert [op for op in summary["by_op"]] == ["standin_test.gpu_like.default"]
