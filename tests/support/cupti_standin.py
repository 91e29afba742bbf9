"""The stand-in libcupti (cupti_standin.c), built with the machine's C compiler and loaded
into the process as torch's CUDA build loads its libcupti (so it is in /proc/self/maps), and
driven through ctypes: activity whose records are laid out from NVIDIA's headers
(cupti_records.py), deliveries on its own thread, failures planted in any call.

``CUPTI_COVERAGE_MODULE`` names a coverage build of tracer.recorder._cupti (made by
tests/integration/test_cupti_coverage.py): :func:`cupti_module` then installs that one."""
from __future__ import annotations

import ctypes
import importlib.machinery
import importlib.util
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

from support import cupti_records as rec

SOURCE = Path(__file__).with_name("cupti_standin.c")
COVERAGE_ENV = "CUPTI_COVERAGE_MODULE"
VARIANTS = {"full": [], "minimal": ["-DSTANDIN_MINIMAL"],
            "broken": ["-DSTANDIN_MINIMAL", "-DSTANDIN_BROKEN"]}
COUNTS = ("requested", "completed", "suppressed", "foreign", "on_worker", "deliveries")


def compiler() -> str:
    cc = sysconfig.get_config_var("CC")
    return cc.split()[0] if cc else "cc"


def build(out_dir: Path, variant: str = "full", libcupti: bool = False) -> Path:
    """The stand-in built as ``out_dir/libstandin-<variant>.so``, or, ``libcupti``, as
    ``out_dir/libcupti.so.13``: the name device_direct.libcupti_path looks for in the process's
    mappings (load that one only in a process of its own: it stays mapped, and every later
    recorder in the process would find it)."""
    name = "libcupti.so.13" if libcupti else f"libstandin-{variant}.so"
    target = Path(out_dir) / name
    target.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([compiler(), "-shared", "-fPIC", "-O1", "-fvisibility=hidden",
                    *VARIANTS[variant], "-o", str(target), str(SOURCE), "-lpthread"],
                   check=True, capture_output=True, text=True)
    return target


def cupti_module():
    """tracer.recorder._cupti: the coverage build named by ``CUPTI_COVERAGE_MODULE`` where
    set (installed before anything imports the built one), else the built one; None where
    neither is."""
    path = os.environ.get(COVERAGE_ENV)
    if path:
        name = "tracer.recorder._cupti"
        if name not in sys.modules or sys.modules[name].__file__ != path:
            import tracer.recorder
            loader = importlib.machinery.ExtensionFileLoader(name, path)
            spec = importlib.util.spec_from_file_location(name, path, loader=loader)
            module = importlib.util.module_from_spec(spec)
            loader.exec_module(module)
            sys.modules[name] = module
            tracer.recorder._cupti = module
        return sys.modules[name]
    try:
        from tracer.recorder import _cupti
    except ImportError:
        return None
    return _cupti


class StandIn:
    """One loaded stand-in: what a test makes happen on the "GPU" and what it asks of it."""

    def __init__(self, path: Path):
        self.path = str(path)
        self.lib = lib = ctypes.CDLL(self.path)
        for name, res, args in (
                ("standin_reset", None, [ctypes.c_uint32]),
                ("standin_record_size", None, [ctypes.c_uint32, ctypes.c_size_t]),
                ("standin_call_name", None, [ctypes.c_uint32, ctypes.c_uint32, ctypes.c_char_p]),
                ("standin_fail", None, [ctypes.c_char_p, ctypes.c_int, ctypes.c_int,
                                        ctypes.c_int]),
                ("standin_activity", ctypes.c_int, [ctypes.c_char_p, ctypes.c_size_t]),
                ("standin_drop", None, [ctypes.c_size_t]),
                ("standin_deliver", None, [ctypes.c_int]),
                ("standin_deliver_foreign", None, []), ("standin_hold", None, []),
                ("standin_parked", ctypes.c_int, []), ("standin_release", None, []),
                ("standin_released_by", ctypes.c_int, []),
                ("standin_kind_on", ctypes.c_int, [ctypes.c_uint32]),
                ("standin_call_on", ctypes.c_int, [ctypes.c_int, ctypes.c_uint32]),
                ("standin_flush_period", ctypes.c_uint32, []),
                ("standin_now", ctypes.c_uint64, []),
                ("standin_count", ctypes.c_long, [ctypes.c_int]),
                ("standin_foreign_buffer", ctypes.c_void_p, [])):
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = res, args
        self._names: list = []        # the kernels' name strings, alive while records point
        self.corr = 0

    def reset(self, version: int = 130001) -> None:
        """A fresh stand-in of that CUPTI version: nothing enabled, queued, failing or held."""
        self.lib.standin_reset(version)
        for layout, kind in ((rec.KERNEL4, "kernel"), (rec.MEMCPY, "memcpy"),
                             (rec.MEMSET, "memset"), (rec.API, "runtime"), (rec.API, "driver")):
            self.lib.standin_record_size(rec.KIND[kind], rec.size(layout))
        self.lib.standin_record_size(rec.KIND_UNKNOWN, rec.UNKNOWN_BYTES)
        for (domain, name), cbid in rec.CALLS.items():
            self.lib.standin_call_name(domain, cbid, name.encode())

    # ------------------------------------------------------------------ activity
    def activity(self, raw: bytes) -> int:
        """A record of something that happened: 1 kept (its kind enabled), 0 not."""
        kept = self.lib.standin_activity(raw, len(raw))
        assert kept >= 0, "a record of a kind the stand-in has no size for"
        return kept

    def _corr(self, corr) -> int:
        self.corr += 1
        return self.corr if corr is None else corr

    def kernel(self, name: bytes, start: int, end: int, device: int = 0, stream: int = 7,
               corr=None) -> int:
        text = ctypes.create_string_buffer(name)
        self._names.append(text)
        return self.activity(rec.pack(rec.KERNEL4, kind=rec.KIND["kernel"], start=start, end=end,
                                      completed=end, deviceId=device, streamId=stream,
                                      correlationId=self._corr(corr), gridX=1, blockX=128,
                                      name=ctypes.addressof(text)))

    def memcpy(self, copy_kind: int, src: int, dst: int, nbytes: int, start: int, end: int,
               stream: int = 7, corr=None) -> int:
        return self.activity(rec.pack(rec.MEMCPY, kind=rec.KIND["memcpy"], copyKind=copy_kind,
                                      srcKind=src, dstKind=dst, bytes=nbytes, start=start,
                                      end=end, streamId=stream, correlationId=self._corr(corr)))

    def memset(self, memory_kind: int, nbytes: int, start: int, end: int, stream: int = 7,
               corr=None) -> int:
        return self.activity(rec.pack(rec.MEMSET, kind=rec.KIND["memset"], bytes=nbytes,
                                      start=start, end=end, streamId=stream,
                                      correlationId=self._corr(corr), memoryKind=memory_kind))

    def call(self, domain: int, name: str, start: int, end: int, thread: int, corr=None) -> int:
        """A runtime or driver call, by its name in cupti_records.CALLS."""
        kind = rec.KIND["runtime" if domain == rec.RUNTIME else "driver"]
        return self.activity(rec.pack(rec.API, kind=kind, cbid=rec.CALLS[(domain, name)],
                                      start=start, end=end, processId=os.getpid(),
                                      threadId=thread, correlationId=self._corr(corr)))

    def unknown(self) -> int:
        return self.activity(rec.KIND_UNKNOWN.to_bytes(4, "little") + bytes(12))

    # ------------------------------------------------------------------ CUPTI's thread
    def deliver(self, later: bool = False) -> None:
        """The worker thread hands back what is queued (waited for unless ``later``)."""
        self.lib.standin_deliver(int(later))

    def fail(self, call: str, result: int, after: int = 0, times: int = 0) -> None:
        """``call`` returns ``result`` from its use number ``after`` (0: the next) on, ``times``
        times (0: ever after)."""
        self.lib.standin_fail(call.encode(), result, after, times)

    def count(self, what: str) -> int:
        return self.lib.standin_count(COUNTS.index(what))

    def __getattr__(self, name: str):
        return getattr(self.lib, "standin_" + name)
