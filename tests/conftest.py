"""Suite-wide settings. The suite is in two folders: tests/unit (starts no process; its
conftest.py fails a test that does) and tests/integration (real processes: trace-run, ranks
on gloo, graphviz, the browser), whose tests all carry the ``integration`` marker. GPU-only
tests carry the ``gpu`` marker and are skipped cleanly where CUDA is absent; everything else
runs on the CPU (multi-rank runs with gloo), also on a machine with GPUs, through
support.cli.CPU_ONLY in the environment of the processes tests start. And the fixtures
several test files share: the traced runs of the reference GPT (tests/support/traced_runs.py),
each run once per session, and the headless browser (tests/support/browser.py).

Test files never import one another: what they share lives here or in tests/support/."""
from __future__ import annotations

from pathlib import Path

import pytest

INTEGRATION = Path(__file__).resolve().parent / "integration"


def pytest_collection_modifyitems(config, items):
    for item in items:
        if INTEGRATION in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.integration)
    gpu = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu:
        return
    import torch
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA: no GPU on this machine")
    for item in gpu:
        item.add_marker(skip)


# ------------------------------------------------------------------------------ shared runs
# Traced runs several test files read: each runs once per session, into a directory of its
# own, and is read-only afterwards (a test that needs to change one copies it first).
@pytest.fixture(scope="session")
def wrapped_runs(tmp_path_factory):
    """The tiny GPT under DDP and under FSDP2, each from its own script (support.wrapped_runs):
    wrap ("ddp", "fsdp2") -> run dir."""
    from support.wrapped_runs import record_wrapped
    return record_wrapped(tmp_path_factory.mktemp("wrapped"))


@pytest.fixture(scope="session")
def callgraph_run(tmp_path_factory):
    """The reference GPT, TP=2 without SP x PP=2 on 4 ranks, one step, traced, with the call
    edges Python's profiling hook saw (traced_runs.ARGS): run dir with ``traces/``."""
    from support import traced_runs
    return traced_runs.trace_reference_gpt(tmp_path_factory.mktemp("callgraph"),
                                           traced_runs.ARGS, calls=True)


@pytest.fixture(scope="session")
def two_step_run(tmp_path_factory):
    """The same run for two optimizer steps (setup and step 0, one counted training step and
    an unfinished tail), its report built by trace-report's code path into the run dir."""
    from support import traced_runs
    from viz.cli import build
    out = traced_runs.trace_reference_gpt(tmp_path_factory.mktemp("two-steps"),
                                          traced_runs.TWO_STEPS)
    build(str(out))
    return out


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium driven over the DevTools protocol (tests/support/browser.py)."""
    from support.browser import Browser
    b = Browser()
    yield b
    b.close()
