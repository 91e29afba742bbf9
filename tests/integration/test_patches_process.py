"""Patches put in and taken out by real traces (the unit checks: tests/unit/test_patches.py)."""
from __future__ import annotations

import json
import subprocess
import sys
import pytest
from support.gpt_helpers import env
from support.patch_targets import CORE, PIPELINING, in_this_torch
from support.paths import REPO, SCRIPTS


# the targets this torch has (an older torch's pipelining lacks one: patch_targets.in_this_torch)
CORE, PIPELINING = in_this_torch(CORE), in_this_torch(PIPELINING)


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> list:
    """The three traces of tests/scripts/patches_put_back.py, in a fresh process."""
    out = tmp_path_factory.mktemp("patches")
    proc = subprocess.run([sys.executable, str(SCRIPTS / "patches_put_back.py"), str(out),
                           json.dumps(CORE + PIPELINING)], cwd=REPO, env=env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_trace_replaces_exactly_the_listed_attributes(traces):
    without, imported, with_pipelining = traces
    assert sorted(without["reported"]) == sorted(CORE)
    assert sorted(without["changed"]) == sorted(CORE)
    # pipelining imported while recording: its patches go in then
    assert sorted(imported["imported_during"]) == sorted(PIPELINING)
    assert sorted(imported["reported"]) == sorted(CORE + PIPELINING)
    assert sorted(imported["changed"]) == sorted(CORE)
    assert sorted(with_pipelining["reported"]) == sorted(CORE + PIPELINING)
    assert sorted(with_pipelining["changed"]) == sorted(CORE + PIPELINING)


def test_after_a_trace_every_attribute_and_hook_is_torchs_again(traces):
    for trace in traces:
        assert trace["not_put_back"] == []
        assert trace["meta_path_back"]          # the import hook for pipelining is gone
        pre, post = trace["hooks_before"]
        # the optimizer step hooks: the session's, and the memory recorder's (the default)
        assert trace["hooks_during"] == [pre + 2, post + 2]
        assert trace["hooks_after"] == [pre, post]
