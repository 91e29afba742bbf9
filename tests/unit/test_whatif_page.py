"""trace-whatif's command and page around the predictions: ``--out`` is optional (without it
the ranking goes to stdout and no file is written, as trace-diff without ``--out``), and the
page says what was recorded in words even when the recording has no config (issue 51: it read
"Recorded: runs/ddp with ."). On constructed recordings (tests/support/whatif_helpers.py)."""
from __future__ import annotations

import os

from support.whatif_helpers import pipeline_run
from viz.render.whatif import WhatIfInput, html
from viz.whatif import WhatIf
from viz.whatif_cli import main, parse

MEASURES = {"step_s": 0.2, "bubble_fraction": 0.1, "exposed_comm_s": 0.01,
            "pipeline_bubble_fraction": None, "ranks": {"0": {"step_s": 0.2}}}


def test_out_is_optional():
    run_dir, report_dir, jobs, targets = parse(["runs/ddp", "--target", "--schedule gpipe"])
    assert (run_dir, report_dir, targets) == ("runs/ddp", None, [{"schedule": "gpipe"}])


def test_without_out_the_ranking_is_printed_and_nothing_written(tmp_path, capsys):
    run = pipeline_run(tmp_path / "run")
    before = sorted(os.listdir(tmp_path / "run"))
    assert main([run, "--target", "--schedule gpipe", "--target", "--microbatches 8"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("what if: recorded tp 1, sp False, pp 2, dp 1, schedule 1f1b")
    names = [line[4:50].strip() for line in out[2:]]
    assert names[:2] == ["recorded configuration, measured", "recorded configuration, replayed"]
    assert sorted(names[2:]) == ["--microbatches 8", "--schedule gpipe"]
    assert sorted(os.listdir(tmp_path / "run")) == before


def test_the_page_says_a_recording_without_config_in_words(tmp_path):
    result = WhatIf({}, MEASURES, MEASURES, None, {}, ["op cost: none"])
    html.render(WhatIfInput(result, "runs/ddp"), str(tmp_path))
    page = (tmp_path / "whatif.html").read_text()
    assert "Recorded: <code>runs/ddp</code> (no configuration recorded)." in page
    assert " with ." not in page and " with\n." not in page


def test_a_target_of_one_flag_needs_no_equals_sign():
    _, _, _, targets = parse(["runs/ddp", "--target", "--no-checkpoint", "--target",
                              "--shard full"])
    assert targets == [{"no_checkpoint": True}, {"shard": "full"}]
