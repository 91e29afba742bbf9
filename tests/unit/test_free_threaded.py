"""Free-threaded Python (3.13t on): setup.py builds neither C extension there, and where the GIL
is off at run time the recorder takes the Python twins of the hot path and Kineto's windows for
device time, before importing an extension (importing one turns the GIL back on for the whole
process). No free-threaded interpreter is on this machine (docs/compat.md): the build's and the
run time's answers are planted here."""
from __future__ import annotations

import runpy
import sys
import sysconfig

import setuptools

from support.paths import REPO
from tracer.recorder.hotpath import _native
from tracer.recorder.device import cupti_direct as device_direct


def extensions_built(monkeypatch, gil_disabled) -> set:
    """The extension modules setup.py asks for, with Py_GIL_DISABLED as given."""
    got: dict = {}
    real = sysconfig.get_config_var
    monkeypatch.setattr(setuptools, "setup", lambda **kwargs: got.update(kwargs))
    monkeypatch.setattr(sysconfig, "get_config_var",
                        lambda name: gil_disabled if name == "Py_GIL_DISABLED" else real(name))
    runpy.run_path(str(REPO / "setup.py"))
    return {extension.name for extension in got["ext_modules"]}


def test_a_free_threaded_build_builds_no_c_extension(monkeypatch):
    assert extensions_built(monkeypatch, 1) == set()
    assert extensions_built(monkeypatch, 0) == {"tracer.recorder._hotpath",
                                                "tracer.recorder._cupti"}


def test_with_the_gil_off_the_recorder_takes_its_python_twins(monkeypatch):
    monkeypatch.setattr(sys, "_is_gil_enabled", lambda: False, raising=False)
    assert not _native.gil_enabled()
    _native.native_hot_path.cache_clear()
    device_direct.native.cache_clear()
    try:
        assert _native.native_hot_path() is None
        assert device_direct.native() == (None, "the GIL is disabled (free-threaded Python)")
    finally:
        monkeypatch.undo()
        _native.native_hot_path.cache_clear()
        device_direct.native.cache_clear()
    assert _native.gil_enabled()
