"""trace-report merging a Kineto export into a recording (the unit checks:
tests/unit/test_device.py)."""
from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
import pytest
from viz.analysis import analyse
from viz.run import open_run
from viz.render.summary_schema import build_summary
from support.paths import GPU_FIXTURE


FIXTURE = GPU_FIXTURE


KINETO = FIXTURE / "kineto.json.gz"


@pytest.fixture(scope="module")
def fixture_run(tmp_path_factory) -> Path:
    """The fixture's trace in a run directory of its own (the fixture stays read-only)."""
    run = tmp_path_factory.mktemp("h100")
    shutil.copytree(FIXTURE / "trace", run / "traces")
    return run


def test_trace_report_merges_a_kineto_export(fixture_run, tmp_path):
    report = os.path.join(os.path.dirname(sys.executable), "trace-report")
    proc = subprocess.run([report, str(fixture_run), "--out", str(tmp_path), "--kineto",
                           str(KINETO)], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr
    rank = json.loads((tmp_path / "summary.json").read_text())["ranks"]["0"]
    assert rank["time"]["clock"] == "device"
    device = rank["device"]
    assert (device["activities"], device["attributed"]) == (1666, 1666)
    export = json.load(gzip.open(KINETO))
    kernels = sum(e["dur"] for e in export["traceEvents"] if e.get("cat") in
                  ("kernel", "gpu_memcpy", "gpu_memset")) / 1e6
    assert sum(device["by_op"].values()) == pytest.approx(kernels, rel=1e-6)
    # busy time merges overlaps, so it is at most the sum (up to float rounding: Python 3.12's
    # sum() of floats is compensated, and gives the sum's last digit otherwise)
    assert device["busy_s"] <= kernels * (1 + 1e-12)
    # without the export: host time, said so
    plain = subprocess.run([report, str(fixture_run), "--out", str(tmp_path / "host")],
                           capture_output=True, text=True, timeout=240)
    assert plain.returncode == 0
    rank = json.loads((tmp_path / "host" / "summary.json").read_text())["ranks"]["0"]
    assert rank["time"]["clock"] == "host" and "device" not in rank


@pytest.fixture(scope="module")
def merged(fixture_run):
    """The fixture's recording with its export merged: (analysis, summary's rank 0)."""
    analysis = analyse(open_run(str(fixture_run)), kineto={0: (str(KINETO),)})
    return analysis, build_summary(analysis)["ranks"]["0"]


def test_an_export_without_base_time_merges_the_same(merged, fixture_run, tmp_path):
    """Torch before 2.1 wrote no baseTimeNanoseconds and absolute microseconds: the same
    export in that form (its times made absolute exactly) merges to the same numbers."""
    import re
    from decimal import Decimal
    text = gzip.open(KINETO, "rt").read()
    base = Decimal(re.search(r'"baseTimeNanoseconds": (\d+)', text).group(1)) / 1000
    text = re.sub(r',?\s*"baseTimeNanoseconds": \d+', "", text)
    text = re.sub(r'"ts": (-?[0-9.]+)', lambda m: f'"ts": {Decimal(m.group(1)) + base}', text)
    old = tmp_path / "old.json"
    old.write_text(text)
    assert json.loads(text)["traceEvents"][0]["ts"] > 1e15
    assert '"baseTimeNanoseconds"' not in old.read_text()
    from viz.cli import report_main
    assert report_main([str(fixture_run), "--out", str(tmp_path / "out"), "--kineto", str(old),
                        "--jobs", "1"]) == 0
    rank = json.loads((tmp_path / "out" / "summary.json").read_text())["ranks"]["0"]
    assert rank["device"] == merged[1]["device"]
    assert rank["time"]["per_step"] == merged[1]["time"]["per_step"]
