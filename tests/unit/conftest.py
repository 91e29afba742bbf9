"""tests/unit starts no process: while a unit test is set up (module and session fixtures
included), runs and is torn down, process creation is a failure (subprocess, fork,
posix_spawn, multiprocessing), so a test that needs one is moved to tests/integration rather
than slowing the fast suite (``python3 -m pytest tests/unit``)."""
from __future__ import annotations

import contextlib
import multiprocessing.process
import os
import subprocess

import pytest


class ProcessStarted(AssertionError):
    """A unit test tried to start a process."""


def _refuse(what):
    def refuse(*args, **kwargs):
        raise ProcessStarted(f"a unit test started a process ({what}): move it to "
                             "tests/integration")
    return refuse


_TARGETS = [(subprocess.Popen, "_execute_child", "subprocess"), (os, "fork", "os.fork"),
            (os, "posix_spawn", "os.posix_spawn"), (os, "posix_spawnp", "os.posix_spawnp"),
            (multiprocessing.process.BaseProcess, "start", "multiprocessing")]


@contextlib.contextmanager
def no_process():
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in _TARGETS
             if hasattr(owner, name)]
    for owner, name, what in _TARGETS:
        if hasattr(owner, name):
            setattr(owner, name, _refuse(what))
    try:
        yield
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    with no_process():
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    with no_process():
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item):
    with no_process():
        yield
