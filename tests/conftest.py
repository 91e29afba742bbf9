"""Suite-wide settings: GPU-only tests carry the ``gpu`` marker and are skipped cleanly where
CUDA is absent; everything else runs on the CPU (multi-rank runs with gloo), also on a machine
with GPUs, through :data:`CPU_ONLY` in the environment of the processes tests start. And the
fixtures several test files share: the traced runs of the reference GPT (tests/traced_runs.py),
each run once per session, and the headless browser (tests/browser.py).

Test files never import one another: what they share lives here or in a helper module
(gpt_helpers, traced_runs, browser, html_links, constructed_timelines, chrome_trace_checks,
trace_run_helpers, attribution_oracle, kineto_oracle, whatif_helpers)."""
from __future__ import annotations

import pytest

# Merged into the environment of every process a test starts: no GPU is visible to it, so the
# reference GPT and the test scripts take the CPU and gloo whatever the machine has.
CPU_ONLY = {"CUDA_VISIBLE_DEVICES": ""}


def pytest_collection_modifyitems(config, items):
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
def callgraph_run(tmp_path_factory):
    """The reference GPT, TP=2 without SP x PP=2 on 4 ranks, one step, traced, with the call
    edges Python's profiling hook saw (traced_runs.ARGS): run dir with ``traces/``."""
    import traced_runs
    return traced_runs.trace_reference_gpt(tmp_path_factory.mktemp("callgraph"),
                                           traced_runs.ARGS, calls=True)


@pytest.fixture(scope="session")
def two_step_run(tmp_path_factory):
    """The same run for two optimizer steps (setup and step 0, one counted training step and
    an unfinished tail), its report built by trace-report's code path into the run dir."""
    import traced_runs
    from viz.cli import build
    out = traced_runs.trace_reference_gpt(tmp_path_factory.mktemp("two-steps"),
                                          traced_runs.TWO_STEPS)
    build(str(out))
    return out


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium driven over the DevTools protocol (tests/browser.py)."""
    from browser import Browser
    b = Browser()
    yield b
    b.close()
