"""tracer/recorder/csrc/cupti/cupti.c against a stand-in libcupti, on the CPU torch (no GPU): every
path of the C module, CUPTI's calls and their error returns, out of memory, and the callbacks
run on the stand-in's own thread, as CUPTI runs them. The records are laid out from NVIDIA's
struct definitions (tests/support/cupti_records.py, checked against the headers by
test_cupti_layout.py), never from the module's own ``layout()``. The stand-in:
tests/support/cupti_standin.c; its line coverage of the C module: test_cupti_coverage.py; the
recorder in processes of their own on it: test_cupti_standin_runs.py."""
from __future__ import annotations

import json
import sys
import threading
import time

import numpy as np
import pytest

from support import cupti_records as rec
from support.cupti_standin import StandIn, build, cupti_module

cupti = cupti_module()
if cupti is None:
    pytest.skip("the _cupti extension is not built (no compiler)", allow_module_level=True)

from tracer.files import rundir  # noqa: E402  (after the coverage build is installed)
from tracer.files.device_format import KINDS, read_device  # noqa: E402
from tracer.recorder.device import cupti_direct as device_direct  # noqa: E402
from tracer.recorder.device.kineto_windows import DeviceRecorder  # noqa: E402

# a long C++ name (the demangler refuses much deeper nesting: 150 levels here) and one that
# only looks mangled (shown as it is, as Kineto shows it)
LONG_MANGLED = b"_ZN" + b"".join(b"%dspace%d" % (len(str(i)) + 5, i) for i in range(100)) + \
    b"6kernelEv"
LONG_SHOWN = "::".join(f"space{i}" for i in range(100)) + "::kernel()"
NOT_MANGLED = "_Z_not_really_mangled"


@pytest.fixture(scope="module")
def lib_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("standin")


@pytest.fixture(scope="module")
def loaded(lib_dir):
    standin = StandIn(build(lib_dir))
    standin.reset()
    assert cupti.load(standin.path) == 130001
    return standin


def drained(known: list) -> tuple:
    """(rows, names known so far, lost, dropped, foreign) of one drain."""
    data, fresh, lost, dropped, foreign = cupti.drain(len(known))
    known.extend(fresh)
    return np.frombuffer(data, dtype=device_direct.ROW), known, lost, dropped, foreign


@pytest.fixture
def standin(loaded):
    """The stand-in, fresh and loaded, with the module stopped, nothing failing and nothing
    left over (the names the module drained before come first in ``names``)."""
    loaded.reset()
    cupti.fail_allocations(-1)
    assert cupti.load(loaded.path) == 130001
    cupti.stop()
    cupti.flush(True)
    names: list = []
    drained(names)
    loaded.names = names
    yield loaded
    loaded.reset()
    cupti.fail_allocations(-1)
    loaded.release()
    cupti.load(loaded.path)
    cupti.stop()
    cupti.flush(True)
    drained(loaded.names)


def now(standin) -> int:
    return int(standin.now())


def test_records_laid_out_by_nvidia_become_rows_on_cuptis_thread(standin):
    cupti.start(1 << 20, 0)
    t = now(standin)
    tid = 0xDEADBEEF
    assert standin.call(rec.RUNTIME, "cudaLaunchKernel_v7000", t, t + 100, tid, corr=1)
    assert standin.kernel(b"_ZN2at6native29vectorized_elementwise_kernelILi4ENS0_11FillFunctorIf"
                          b"EESt5arrayIPcLm1EEEEviT0_T1_", t + 200, t + 2_700, 0, 7, corr=1)
    assert standin.call(rec.DRIVER, "cuLaunchKernel", t + 300, t + 400, tid, corr=2)
    assert standin.kernel(LONG_MANGLED, t + 500, t + 600, 1, 9, corr=2)
    assert standin.kernel(b"triton_poi_fused_gelu_0_" + b"x" * 5000, t + 700, t + 800, 1, 9,
                          corr=3)
    assert standin.kernel(NOT_MANGLED.encode(), t + 850, t + 870, 1, 9, corr=3)
    assert standin.call(rec.RUNTIME, "cudaMemcpyAsync_v3020", t + 900, t + 950, tid, corr=4)
    assert standin.memcpy(2, 3, 2, 4096, t + 1_000, t + 2_000, corr=4)
    assert standin.memset(3, 512, t + 3_000, t + 3_100, corr=5)
    assert standin.unknown() == 0          # not enabled: CUPTI records nothing of it
    standin.lib.standin_record_size(rec.KIND["kernel"], rec.size(rec.KERNEL4))
    standin.drop(3)                        # CUPTI found no buffer space for 3 records
    standin.deliver()
    rows, names, lost, dropped, foreign = drained(standin.names)
    assert (lost, dropped, foreign) == (0, 3, 0)
    assert standin.count("completed") == standin.count("on_worker") == 1
    # Kineto's names (tests/assets/gpu-h100/kineto.json.gz has each of these forms)
    assert [names[i] for i in rows["name"]] == [
        "cudaLaunchKernel",
        "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, "
        "std::array<char*, 1ul> >(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)",
        "cuLaunchKernel", LONG_SHOWN, "triton_poi_fused_gelu_0_" + "x" * 5000, NOT_MANGLED,
        "cudaMemcpyAsync", "Memcpy DtoH (Device -> Pinned)", "Memset (Device)"]
    assert [KINDS[k] for k in rows["kind"]] == ["runtime", "kernel", "driver", "kernel",
                                                "kernel", "kernel", "runtime", "memcpy",
                                                "memset"]
    assert rows["start"].tolist() == [t + d for d in (0, 200, 300, 500, 700, 850, 900, 1_000,
                                                      3_000)]
    assert rows["end"].tolist() == [t + d for d in (100, 2_700, 400, 600, 800, 870, 950, 2_000,
                                                    3_100)]
    assert rows["corr"].tolist() == [1, 1, 2, 2, 3, 3, 4, 4, 5]
    assert rows["device"].tolist() == [-1, 0, -1, 1, 1, 1, -1, 0, 0]
    assert rows["stream"].tolist() == [-1, 7, -1, 9, 9, 9, -1, 7, 7]
    assert rows["tid"].tolist() == [tid, 0, tid, 0, 0, 0, tid, 0, 0]
    assert rows["nbytes"].tolist() == [0, 0, 0, 0, 0, 0, 0, 4096, 512]


def test_a_kind_this_module_does_not_read_is_left_out(standin):
    cupti.start(1 << 20, 0)
    standin.lib.standin_record_size(rec.KIND_UNKNOWN, rec.UNKNOWN_BYTES)
    # another subscriber (a later CUPTI's kind) enabled it: its records come in the buffers
    assert standin.lib.cuptiActivityEnable(rec.KIND_UNKNOWN) == 0
    t = now(standin)
    assert standin.unknown() and standin.kernel(b"after_the_unknown", t, t + 5)
    assert standin.activity(rec.pack(rec.KERNEL4, kind=rec.KIND["kernel"], start=t, end=t + 1,
                                     name=0))         # a kernel CUPTI knows no name of
    standin.deliver()
    rows, names, *_ = drained(standin.names)
    assert [names[i] for i in rows["name"]] == ["after_the_unknown", "(unnamed kernel)"]


def test_thousands_of_names_each_keep_their_index(standin):
    cupti.start(1 << 20, 0)
    t = now(standin)
    kernels = [f"many_{i}" for i in range(5000)]          # the table grows past 2,048 names
    for i, name in enumerate(kernels):
        standin.kernel(name.encode(), t + i, t + i + 1)
    for name in kernels[::-1][:10]:
        standin.kernel(name.encode(), t, t + 1)
    standin.deliver()
    rows, names, *_ = drained(standin.names)
    assert [names[i] for i in rows["name"]] == kernels + kernels[::-1][:10]


def test_a_drain_asked_for_names_it_never_made_is_refused(standin):
    with pytest.raises(ValueError, match=r"^drain: known < 0$"):
        cupti.drain(-1)
    with pytest.raises(ValueError, match=r"names known, \d+ interned$"):
        cupti.drain(len(standin.names) + 1)
    with pytest.raises(OverflowError):
        cupti.drain(1 << 80)

    class Undecided:
        def __bool__(self):
            raise RuntimeError("no answer")
    with pytest.raises(RuntimeError, match="^no answer$"):
        cupti.flush(Undecided())


def test_each_mangled_name_is_demangled_once(standin):
    cupti.start(1 << 20, 0)
    before = cupti.counters()["demangled"]
    t = now(standin)
    once_a, once_b = b"_ZN4once1aEv", b"_ZN4once" + LONG_MANGLED[3:]    # new to the module
    for i in range(300):
        standin.kernel(once_b if i % 3 else once_a, t + i, t + i + 1)
    standin.deliver()
    rows, names, *_ = drained(standin.names)
    assert len(rows) == 300
    assert [names[i] for i in rows["name"][:3]] == ["once::a()", "once::" + LONG_SHOWN,
                                                     "once::" + LONG_SHOWN]
    assert cupti.counters()["demangled"] - before == 2


def test_start_enables_only_the_calls_attribution_uses_and_stop_undoes_it(standin):
    cupti.start(1 << 20, 500)
    launches = {(d, n) for (d, n) in rec.CALLS
                if n.startswith(("cudaLaunch", "cudaMemcpy", "cudaMemset", "cudaGraphLaunch",
                                 "cuLaunch", "cuMemcpy", "cuMemset", "cuGraphLaunch"))}
    assert launches and len(launches) < len(rec.CALLS)
    for (domain, name), cbid in rec.CALLS.items():
        assert standin.call_on(0 if domain == rec.DRIVER else 1, cbid) == \
            ((domain, name) in launches), name
    # the whole runtime and driver kinds stay off: cudaGetDevice... are not recorded at all
    assert not standin.kind_on(rec.KIND["runtime"]) and not standin.kind_on(rec.KIND["driver"])
    assert [standin.kind_on(rec.KIND[k]) for k in ("kernel", "memcpy", "memset")] == [1, 1, 1]
    t = now(standin)
    assert standin.call(rec.RUNTIME, "cudaGetDevice_v3020", t, t + 1, 5) == 0
    assert standin.call(rec.DRIVER, "cuCtxGetCurrent", t, t + 1, 5) == 0
    assert standin.call(rec.RUNTIME, "cudaLaunchKernel_v7000", t, t + 1, 5) == 1
    assert standin.flush_period() == 500
    counters = cupti.counters()
    assert (counters["runtime_calls"], counters["driver_calls"]) == (5, 3)
    cupti.stop()
    assert standin.flush_period() == 0                 # CUPTI's own heuristics again
    assert not any(standin.kind_on(k) for k in (1, 2, 4, 5, 10))
    assert not any(standin.call_on(0 if d == rec.DRIVER else 1, c)
                   for (d, _), c in rec.CALLS.items())


def test_the_drain_never_waits_for_cuptis_thread_holding_the_gil(standin):
    # CUPTI's thread is held inside the module's parse (the module's lock taken); a drain
    # meanwhile must wait without the GIL, so another Python thread (here, this one) runs
    cupti.start(1 << 20, 0)
    t = now(standin)
    standin.kernel(b"held_kernel", t, t + 1)
    standin.hold()
    standin.deliver(later=True)
    deadline = time.monotonic() + 60
    while not standin.parked():
        assert time.monotonic() < deadline, "the stand-in's thread never reached the parse"
        time.sleep(0.001)
    got = {}
    main = threading.get_ident()

    def drain():
        got["drain"] = drained(standin.names)
    drainer = threading.Thread(target=drain)
    drainer.start()
    # wait until the drainer is inside the drain call (its frame on the call's line)
    while sys._current_frames().get(drainer.ident) is None or \
            sys._current_frames()[drainer.ident].f_code.co_name != "drained":
        time.sleep(0.001)
    time.sleep(0.2)
    assert threading.get_ident() == main
    standin.release()          # runs only if the drainer let go of the GIL while it waits
    drainer.join(60)
    assert standin.released_by() == 1, "the drain held the GIL: the watchdog released it"
    rows, names, *_ = got["drain"]
    # the drain waited for the whole buffer's parse
    assert [names[i] for i in rows["name"]] == ["held_kernel"]


def test_a_failed_drain_loses_nothing(standin):
    # each allocation of the drain fails in turn (CPython's allocator, then the C module's
    # own): the rows stay in the module and the names are asked for again, so the drain that
    # succeeds returns every row, each pointing at its name, and so do the later ones
    testcapi = pytest.importorskip("_testcapi", reason="CPython's _testcapi (set_nomemory)")
    cupti.start(1 << 20, 0)
    t = now(standin)
    kernels = [f"kernel_{i}" for i in range(5)]
    for i, name in enumerate(kernels):
        standin.kernel(name.encode(), t + i, t + i + 1)
    standin.deliver()
    cupti.fail_allocations(0)
    with pytest.raises(MemoryError):
        cupti.drain(len(standin.names))
    cupti.fail_allocations(-1)
    failures, out = 1, None
    for attempt in range(100):
        testcapi.set_nomemory(attempt, attempt + 1)
        try:
            out = cupti.drain(len(standin.names))
        except MemoryError:
            failures += 1
        finally:
            testcapi.remove_mem_hooks()
        if out is not None:
            break
    assert out is not None and failures >= 3   # the pointers, the list, a name, the bytes
    data, fresh, lost, dropped, foreign = out
    names = standin.names + fresh
    rows = np.frombuffer(data, dtype=device_direct.ROW)
    assert [names[i] for i in rows["name"]] == kernels and (lost, dropped, foreign) == (0, 0, 0)
    standin.names[:] = names
    standin.kernel(b"afterwards", t + 10, t + 11)
    standin.deliver()
    later, names, *_ = drained(standin.names)
    assert [names[i] for i in later["name"]] == ["afterwards"]


def test_cuptis_thread_hands_buffers_back_every_flush_period(standin):
    cupti.start(1 << 20, 20)
    t = now(standin)
    standin.kernel(b"periodic", t, t + 1)
    deadline = time.monotonic() + 60
    while standin.count("completed") == 0:       # no flush asked: the period's
        assert time.monotonic() < deadline, "the stand-in's period never came"
        time.sleep(0.01)
    rows, names, *_ = drained(standin.names)
    assert [names[i] for i in rows["name"]] == ["periodic"]
    assert standin.count("on_worker") == standin.count("completed") == 1
    assert cupti.counters()["buffers_out"] == 0       # each buffer handed out came back, freed


@pytest.mark.parametrize("call, after", [("cuptiActivityRegisterCallbacks", 0),
                                         ("cuptiActivityEnable", 2),
                                         ("cuptiActivityEnableRuntimeApi", 0)])
def test_a_start_cupti_refuses_turns_off_what_it_turned_on(standin, call, after):
    if call == "cuptiActivityEnableRuntimeApi":
        standin.fail("cuptiActivityEnable", 999, 3)    # and the whole runtime kind after it
    standin.fail(call, 999, after)
    failed = "cuptiActivityRegisterCallbacks" if after == 0 and "Register" in call else \
        "cuptiActivityEnable"
    with pytest.raises(RuntimeError, match=f"^{failed}: CUPTI_ERROR_UNKNOWN \\(999\\)$"):
        cupti.start(1 << 20, 500)
    assert not any(standin.kind_on(k) for k in (1, 2, 4, 5, 10))
    assert not any(standin.call_on(d, c) for d in (0, 1) for c in range(1024))
    assert standin.flush_period() == 0


def test_where_one_call_cannot_be_enabled_its_whole_kind_is(standin):
    standin.fail("cuptiActivityEnableDriverApi", 999, 1, 1)    # the second of three
    cupti.start(1 << 20, 0)
    assert standin.kind_on(rec.KIND["driver"]) and not standin.kind_on(rec.KIND["runtime"])
    assert not any(standin.call_on(0, c) for c in range(1024))
    assert standin.call_on(1, rec.CALLS[(rec.RUNTIME, "cudaLaunchKernel_v7000")])
    t = now(standin)
    # every driver call is recorded then, and only the launches kept
    assert standin.call(rec.DRIVER, "cuCtxGetCurrent", t, t + 1, 3) == 1
    assert standin.call(rec.DRIVER, "cuLaunchKernel", t + 2, t + 3, 3) == 1
    standin.deliver()
    rows, names, *_ = drained(standin.names)
    assert [names[i] for i in rows["name"]] == ["cuLaunchKernel"]
    cupti.stop()
    assert not standin.kind_on(rec.KIND["driver"])


def test_cuptis_error_returns_are_said_and_nothing_more_is_read(standin):
    cupti.start(1 << 20, 0)
    t = now(standin)
    for i in range(3):
        standin.kernel(f"read_{i}".encode(), t + i, t + i + 1)
    standin.drop(5)
    standin.fail("cuptiActivityGetNextRecord", 21, 2)      # an invalid record: the rest unread
    standin.fail("cuptiActivityGetNumDroppedRecords", 15)
    standin.deliver()
    rows, names, lost, dropped, _ = drained(standin.names)
    assert [names[i] for i in rows["name"]] == ["read_0", "read_1"] and (lost, dropped) == (0, 0)
    standin.fail("cuptiActivityFlushAll", 999)
    with pytest.raises(RuntimeError, match=r"^cuptiActivityFlushAll: CUPTI_ERROR_UNKNOWN \(999\)"):
        cupti.flush(True)
    standin.fail("cuptiActivityFlushAll", 777)             # a code CUPTI has no words for
    with pytest.raises(RuntimeError, match=r"^cuptiActivityFlushAll: CUPTI error \(777\)$"):
        cupti.flush(False)


def test_where_cupti_takes_no_clock_each_drain_pairs_its_own(standin):
    standin.fail("cuptiActivityRegisterTimestampCallback", 999)
    cupti.start(1 << 20, 0)
    assert not cupti.own_clock()
    cupti_ns, unix_ns = cupti.clock()
    # the stand-in's own clock, 123 ms behind Unix time (read a moment before it)
    assert 123_456_789 <= unix_ns - cupti_ns < 123_456_789 + 60 * 10**9
    standin.fail("cuptiGetTimestamp", 999)
    with pytest.raises(RuntimeError, match=r"^cuptiGetTimestamp: CUPTI_ERROR_UNKNOWN"):
        cupti.clock()


def test_the_recorder_keeps_to_host_time_where_cuptis_clock_fails(standin, tmp_path, capfd):
    standin.fail("cuptiActivityRegisterTimestampCallback", 999)
    cupti.start(1 << 20, 0)              # CUPTI's clock is its own from now on
    cupti.stop()
    standin.fail("cuptiGetTimestamp", 999)
    recorder = device_direct.DirectDeviceRecorder(str(tmp_path), 0, [], cupti, 130001,
                                                  standin.path)
    assert recorder.start() is False and recorder.boundary(True) is False
    recorder.close()
    assert recorder.error == ("CUPTI did not start (cuptiGetTimestamp: CUPTI_ERROR_UNKNOWN "
                              "(999))")
    assert capfd.readouterr().err.count("CUPTI did not start") == 1


def test_a_library_that_fails_or_lacks_a_call_is_refused_and_the_loaded_one_kept(standin,
                                                                                lib_dir):
    standin.fail("cuptiGetVersion", 15)
    with pytest.raises(RuntimeError, match=r"^cuptiGetVersion: CUPTI_ERROR_NOT_INITIALIZED"):
        cupti.load(standin.path)
    with pytest.raises(OSError, match=r"libstandin-broken.so: no cuptiActivityEnable$"):
        cupti.load(str(build(lib_dir, "broken")))
    with pytest.raises(OSError):
        cupti.load(str(lib_dir / "absent.so"))
    standin.reset()
    cupti.start(1 << 20, 0)             # still the stand-in loaded before
    assert standin.kind_on(rec.KIND["kernel"])


def test_a_libcupti_without_the_optional_calls_still_records(standin, lib_dir):
    minimal = StandIn(build(lib_dir, "minimal"))
    minimal.reset()
    assert cupti.load(minimal.path) == 130001
    cupti.start(1 << 20, 500)
    # no per-call switches, no clock, no flush period, no call names: every call's records,
    # none kept (unnamed), the kernels as ever
    assert minimal.kind_on(rec.KIND["runtime"]) and minimal.kind_on(rec.KIND["driver"])
    assert not cupti.own_clock() and minimal.flush_period() == 0
    t = int(minimal.now())
    minimal.call(rec.RUNTIME, "cudaLaunchKernel_v7000", t, t + 1, 3)
    minimal.kernel(b"minimal_kernel", t + 2, t + 3)
    cupti.flush(True)
    rows, names, *_ = drained(standin.names)
    assert [names[i] for i in rows["name"]] == ["minimal_kernel"]
    cupti.stop()
    assert not minimal.kind_on(rec.KIND["runtime"])


def test_an_untested_cupti_version_does_not_start(standin):
    standin.reset(130202)
    assert cupti.load(standin.path) == 130202
    assert 130202 not in cupti.TESTED_VERSIONS and 130001 in cupti.TESTED_VERSIONS
    with pytest.raises(RuntimeError, match="^CUPTI 130202: its record layouts are not tested$"):
        cupti.start(1 << 20, 0)
    assert not standin.kind_on(rec.KIND["kernel"])


def test_an_untested_cupti_falls_back_to_kinetos_windows_and_says_so(standin, tmp_path,
                                                                   monkeypatch, capfd):
    standin.reset(130202)
    monkeypatch.delenv(device_direct.SOURCE_ENV, raising=False)
    monkeypatch.setattr(device_direct, "libcupti_path", lambda: standin.path)
    device_direct.native.cache_clear()
    try:
        recorder = device_direct.device_recorder(str(tmp_path), 2, [])
    finally:
        device_direct.native.cache_clear()
    assert type(recorder) is DeviceRecorder
    tested = ", ".join(map(str, cupti.TESTED_VERSIONS))
    assert recorder.error == (f"{standin.path} is CUPTI 130202, whose record "
                              f"layouts are not tested (tested: {tested}); device time comes "
                              "from Kineto's windows")
    assert capfd.readouterr().err == f"paratrace: rank 2: {recorder.error}\n"


def test_the_recorder_retries_a_drain_that_ran_out_of_memory(standin, tmp_path):
    recorder = device_direct.DirectDeviceRecorder(str(tmp_path), 0, [], cupti, 130001,
                                                  standin.path)
    assert recorder.start()
    t = now(standin)
    standin.kernel(b"drained_on_the_second_try", t, t + 1)
    standin.deliver()
    cupti.fail_allocations(0)           # the drain's copy of the new names' pointers
    recorder.write_pending()            # the flusher's call: no exception
    cupti.fail_allocations(-1)
    assert recorder.windows == 0
    recorder.close()
    records, _, problem = read_device(rundir.device_file(str(tmp_path), 0))
    assert problem is None and [records.names[i] for i in records.name] == \
        ["drained_on_the_second_try"]
    assert recorder.error == "a drain of CUPTI's rows ran out of memory (retried at the next)"


def test_without_memory_on_cuptis_thread_rows_are_lost_and_counted_never_misnamed(standin):
    # each allocation of the records half fails in turn while new names come: a buffer not
    # handed out (CUPTI drops its records), a name or a row not made (the row is lost); every
    # record is then a row under its own name, a lost row or a dropped record
    cupti.start(1 << 20, 0)
    t = now(standin)
    made = []
    for attempt in range(12):
        cupti.fail_allocations(attempt)
        for i in range(3):
            name = f"oom_{attempt}_{i}"
            standin.kernel(name.encode(), t + i, t + i + 1)
            made.append(name)
        standin.call(rec.DRIVER, "cuMemcpyHtoD_v2", t, t + 1, 9)   # a name only this test has
        made.append("cuMemcpyHtoD")
        standin.deliver()
        cupti.fail_allocations(-1)
    standin.kernel(b"the_last", t, t + 1)          # its buffer's completion says the drops
    made.append("the_last")
    standin.deliver()
    rows, names, lost, dropped, _ = drained(standin.names)
    got = [names[i] for i in rows["name"]]
    assert lost > 0 and dropped > 0
    assert len(got) + lost + dropped == len(made)
    assert set(got) <= set(made) and got[-1] == "the_last"
    assert len(got) == len(set(got) - {"cuMemcpyHtoD"}) + got.count("cuMemcpyHtoD")
