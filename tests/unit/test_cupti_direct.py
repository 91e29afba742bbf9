"""CUPTI's activity API without Kineto (tracer/recorder/csrc/cupti/cupti.c, cupti_direct.py),
without a GPU: each record kind, laid out from NVIDIA's struct definitions (tests/support/
cupti_records.py), through the completion path's parse into device-file rows, and the real libcupti
of a CUDA build of torch loaded, naming the launches by NVIDIA's callback ids and refusing to start
where no driver is. The record layouts against NVIDIA's headers:
tests/integration/test_cupti_layout.py; every path of the C module against a stand-in libcupti:
tests/integration/test_cupti_standin.py; the whole recorder on this path, with rows fed from
recorded ops: tests/integration/test_device_direct.py. On a GPU: scripts/gpu_checks.sh.

The checks that need CUPTI's headers or library run in the compatibility venvs (CUDA builds of
torch: scripts/compat.sh); the pinned CPU build has neither."""
from __future__ import annotations

import ctypes
import os
import re
import sys

import numpy as np
import pytest

from support import cupti_records as rec
from support.cupti_headers import header_sets
from tracer.files import rundir
from tracer.files.device_format import KINDS, read_device
from tracer.recorder.device import cupti_direct as device_direct
from tracer.recorder.device.kineto_windows import DeviceRecorder

cupti = pytest.importorskip("tracer.recorder._cupti",
                            reason="the _cupti extension is not built (no compiler)")


def kernel(name: bytes, start: int, end: int, device: int, stream: int, corr: int):
    """A kernel's record as NVIDIA lays it out, and the name it points at (kept alive)."""
    buf = ctypes.create_string_buffer(name)
    raw = rec.pack(rec.KERNEL4, kind=rec.KIND["kernel"], start=start, end=end, deviceId=device,
                   streamId=stream, correlationId=corr, name=ctypes.addressof(buf))
    return raw, buf


def drained() -> tuple:
    """(rows, every name the module has drained in this process, rows lost, records dropped)."""
    data, names, lost, dropped, _ = device_direct.drain(cupti)
    return np.frombuffer(data, dtype=device_direct.ROW), names, lost, dropped


@pytest.fixture(autouse=True)
def empty_module():
    drained()
    yield
    drained()


def test_each_record_kind_becomes_a_row_of_the_device_format():
    raw, buf = kernel(b"_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIfEES"
                      b"t5arrayIPcLm1EEEEviT0_T1_", 1_000, 3_500, 0, 7, 41)
    cupti.take_record(raw)
    triton, tbuf = kernel(b"triton_poi_fused_gelu_0", 4_000, 4_200, 1, 9, 42)
    cupti.take_record(triton)
    cupti.take_record(rec.pack(rec.MEMCPY, kind=rec.KIND["memcpy"], copyKind=2, srcKind=3,
                               dstKind=2, bytes=4096, start=5_000, end=6_000, streamId=7,
                               correlationId=43))
    cupti.take_record(rec.pack(rec.MEMSET, kind=rec.KIND["memset"], bytes=512, start=7_000,
                               end=7_100, streamId=7, correlationId=44, memoryKind=3))
    cupti.take_record(rec.pack(rec.API, kind=6))   # a kind not enabled: left out
    rows, names, lost, dropped = drained()
    assert (lost, dropped) == (0, 0)
    # Kineto's names (tests/assets/gpu-h100/kineto.json.gz has each of these forms)
    assert [names[i] for i in rows["name"]] == [
        "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
        "std::array<char*, 1ul> >(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)",
        "triton_poi_fused_gelu_0", "Memcpy DtoH (Device -> Pinned)", "Memset (Device)"]
    assert [KINDS[k] for k in rows["kind"]] == ["kernel", "kernel", "memcpy", "memset"]
    assert rows["start"].tolist() == [1_000, 4_000, 5_000, 7_000]
    assert rows["end"].tolist() == [3_500, 4_200, 6_000, 7_100]
    assert rows["device"].tolist() == [0, 1, 0, 0]
    assert rows["stream"].tolist() == [7, 9, 7, 7]
    assert rows["corr"].tolist() == [41, 42, 43, 44]
    assert rows["nbytes"].tolist() == [0, 0, 4096, 512]
    # a name is drained once; a later row of the same kernel points at it
    known = len(names)
    again, abuf = kernel(b"triton_poi_fused_gelu_0", 8_000, 8_100, 1, 9, 45)
    cupti.take_record(again)
    rows, names, _, _ = drained()
    assert len(names) == known and [names[i] for i in rows["name"]] == ["triton_poi_fused_gelu_0"]
    del buf, tbuf, abuf


def test_drained_rows_become_records_in_unix_ns_with_only_their_names():
    rows = np.zeros(3, dtype=device_direct.ROW)
    rows["kind"] = [0, 3, 0]
    rows["name"] = [4, 1, 4]
    rows["start"], rows["end"] = [10, 5, 30], [20, 6, 40]
    rows["corr"], rows["tid"] = [7, 7, 8], [0, 123, 0]
    names = ["a", "cudaLaunchKernel", "b", "c", "k"]
    got = device_direct.records_of(rows.tobytes(), names, offset_ns=1_000)
    assert got.names == ["cudaLaunchKernel", "k"]
    assert [got.names[i] for i in got.name] == ["k", "cudaLaunchKernel", "k"]
    assert got.start.tolist() == [1_010, 1_005, 1_030] and got.end.tolist() == [1_020, 1_006,
                                                                                 1_040]
    assert got.is_launch.tolist() == [False, True, False] and got.tid.tolist() == [0, 123, 0]


def test_the_source_is_named_by_its_variable(monkeypatch):
    monkeypatch.delenv(device_direct.SOURCE_ENV, raising=False)
    assert device_direct.source() == "cupti"
    monkeypatch.setenv(device_direct.SOURCE_ENV, "Kineto")
    assert device_direct.source() == "kineto"
    monkeypatch.setenv(device_direct.SOURCE_ENV, "CUPTI")
    assert device_direct.source() == "cupti"
    monkeypatch.setenv(device_direct.SOURCE_ENV, "nvtx")
    with pytest.raises(ValueError, match="PARATRACE_DEVICE_SOURCE='nvtx': expected one of "
                                         "kineto, cupti"):
        device_direct.source()


def test_the_libcupti_of_the_process_is_found_in_its_mappings(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text(
        "7f00-7f01 r-xp 00000000 08:01 1 /usr/lib/libc.so.6\n"
        "7f02-7f03 r-xp 00000000 08:01 2 /venv/nvidia/cu13/lib/libcupti.so.13\n"
        "7f04-7f05 rw-p 00000000 00:00 0 \n")
    assert device_direct.libcupti_path(str(maps)) == "/venv/nvidia/cu13/lib/libcupti.so.13"
    maps.write_text("7f00-7f01 r-xp 00000000 08:01 1 /usr/lib/libc.so.6\n")
    assert device_direct.libcupti_path(str(maps)) is None
    assert device_direct.libcupti_path(str(tmp_path / "none")) is None


def real_cupti():
    found, why = device_direct.native()
    if found is None:
        pytest.skip(f"{why}: a CPU build of torch (scripts/compat.sh runs this in CUDA builds)")
    return found


def cbid(header: str, name: str) -> int:
    """A callback id as NVIDIA's header numbers it."""
    for header_dir, _ in header_sets():
        path = os.path.join(header_dir, header)
        if os.path.exists(path):
            with open(path) as fh:
                found = re.search(rf"\b{name}\s*=\s*(\d+)", fh.read())
            if found:
                return int(found.group(1))
    pytest.skip(f"no {header} with {name}")


def test_the_real_libcupti_names_the_launches_and_leaves_the_rest_out():
    module, version, path = real_cupti()
    assert module is cupti and version > 0 and "libcupti.so" in os.path.basename(path)

    def api(kind: int, callback: int, corr: int) -> bytes:
        return rec.pack(rec.API, kind=kind, cbid=callback, start=100 + corr, end=200 + corr,
                        threadId=0xDEADBEEF, correlationId=corr)
    runtime = "cupti_runtime_cbid.h"
    cupti.take_record(api(5, cbid(runtime, "CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000"), 1))
    cupti.take_record(api(5, cbid(runtime, "CUPTI_RUNTIME_TRACE_CBID_cudaGetDevice_v3020"), 2))
    cupti.take_record(api(5, cbid(runtime, "CUPTI_RUNTIME_TRACE_CBID_cudaMemcpyAsync_v3020"), 3))
    cupti.take_record(api(4, cbid("cupti_driver_cbid.h", "CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel"),
                          4))
    cupti.take_record(api(4, cbid("cupti_driver_cbid.h", "CUPTI_DRIVER_TRACE_CBID_cuCtxGetDevice"),
                          5))
    rows, names, _, _ = drained()
    # the launches, named as Kineto's export names them; cudaGetDevice and cuCtxGetDevice
    # launch nothing and are left out
    assert [names[i] for i in rows["name"]] == ["cudaLaunchKernel", "cudaMemcpyAsync",
                                                "cuLaunchKernel"]
    assert [KINDS[k] for k in rows["kind"]] == ["runtime", "runtime", "driver"]
    assert rows["corr"].tolist() == [1, 3, 4] and set(rows["tid"].tolist()) == {0xDEADBEEF}
    assert rows["start"].tolist() == [101, 103, 104]
    cupti_ns, unix_ns = cupti.clock()
    assert cupti_ns > 0 and unix_ns > 0


def test_where_cupti_cannot_start_the_recorder_keeps_to_host_time(tmp_path, capfd):
    module, version, path = real_cupti()
    recorder = device_direct.DirectDeviceRecorder(str(tmp_path), 0, [], module, version, path)
    import torch
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: CUPTI starts")
    assert recorder.start() is False and recorder.boundary(True) is False
    assert recorder.error.startswith("CUPTI did not start (cuptiActivityEnable: ")
    recorder.close()
    assert recorder.meta()["windows"] == 0 and os.listdir(tmp_path) == []
    assert capfd.readouterr().err.count("CUPTI did not start") == 1


def test_asking_for_cupti_without_it_falls_back_to_kinetos_windows(tmp_path, monkeypatch, capfd):
    monkeypatch.setenv(device_direct.SOURCE_ENV, "cupti")
    monkeypatch.setattr(device_direct, "native", lambda: (None, "torch loaded no libcupti"))
    monkeypatch.setattr(device_direct, "libcupti_path", lambda: None)
    recorder = device_direct.device_recorder(str(tmp_path), 3, [])
    assert isinstance(recorder, DeviceRecorder)
    assert recorder.error == ("PARATRACE_DEVICE_SOURCE=cupti: torch loaded no libcupti; device "
                              "time comes from Kineto's windows")
    assert capfd.readouterr().err == f"paratrace: rank 3: {recorder.error}\n"
    # the default (CUPTI, not asked for by name) falls back quietly
    monkeypatch.delenv(device_direct.SOURCE_ENV)
    quiet = device_direct.device_recorder(str(tmp_path), 3, [])
    assert type(quiet) is DeviceRecorder and quiet.error is None
    assert capfd.readouterr().err == ""
    monkeypatch.setenv(device_direct.SOURCE_ENV, "kineto")
    assert type(device_direct.device_recorder(str(tmp_path), 3, [])) is DeviceRecorder
    assert sys.modules["tracer.recorder._cupti"] is cupti


class RealParse:
    """The C module's parse and drain, with the host's clock for CUPTI's (no libcupti here)."""
    drain = staticmethod(cupti.drain)

    @staticmethod
    def clock() -> tuple:
        import time
        now = time.time_ns()
        return now, now

    @staticmethod
    def own_clock() -> bool:
        return True


def test_a_later_session_in_the_process_reads_the_names_an_earlier_one_drained(tmp_path):
    # the C module interns names once per process: the second recorder's rows point at a name
    # the first one drained
    module = RealParse()
    first, second = tmp_path / "first", tmp_path / "second"
    for out, kernels in ((first, [b"kernel_a"]), (second, [b"kernel_a", b"kernel_b"])):
        out.mkdir()
        recorder = device_direct.DirectDeviceRecorder(str(out), 0, [], module, 1, "x")
        now = RealParse.clock()[0]
        held = [kernel(name, now, now + 10, 0, 7, i) for i, name in enumerate(kernels)]
        for raw, _ in held:
            cupti.take_record(raw)
        recorder.write_pending()
        recorder.close()
        records, _, problem = read_device(rundir.device_file(str(out), 0))
        assert problem is None and recorder.error is None
        assert [records.names[i] for i in records.name] == [k.decode() for k in kernels]
