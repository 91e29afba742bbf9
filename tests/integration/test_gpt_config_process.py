"""The reference GPT's configuration checks in a real process (the unit checks:
tests/unit/test_gpt_config.py)."""
from __future__ import annotations

from support.gpt_helpers import launch


def test_impossible_configuration_in_a_real_process():
    proc = launch(1, ["--tp", "2", "--pp", "2"])
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert proc.stdout == ""
