"""trace-report --kineto merging damaged or odd exports (the unit checks:
tests/unit/test_kineto_inputs.py)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
import pytest
from tracer.kineto.chrome_trace import KinetoError, load_chrome_trace
from viz.cli import report_main
from support.paths import ASSETS
from support.kineto_exports import BASE, export, write


FIXTURE = ASSETS / "gpu-h100"


def test_a_truncated_export_keeps_what_came_before(tmp_path):
    # torch writes baseTimeNanoseconds last, so a cut export loses it: here it comes first
    data = {"baseTimeNanoseconds": BASE, **export()}
    text = json.dumps(data, indent=1)
    cut = text.index('"cudaLaunchKernel"', text.index('"ts": 210.0'))   # inside event 9
    records = load_chrome_trace(str(write(tmp_path / "cut.json.gz", None, text[:cut])))
    assert records.meta["damage"] == ["the file ends inside traceEvents, after 8 events"]
    assert (~records.is_launch).sum() == 2
    # as torch writes it, cut: its relative times cannot be merged, but analysed on their own
    text = json.dumps(export(), indent=1)
    path = write(tmp_path / "torch.json", None, text[:text.index('"ts": 210.0')])  # event 8
    with pytest.raises(KinetoError, match="no usable baseTimeNanoseconds"):
        load_chrome_trace(str(path))
    assert report_main([str(tmp_path / "run"), "--kineto", str(path), "--jobs", "1"]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["ranks"]["0"]["device"]["whole"]["kernels"] == 2
    assert summary["ranks"]["0"]["warnings"] == [
        f"{path}: the file ends inside traceEvents, after 7 events; its other 7 events are "
        "used"]


@pytest.fixture
def run(tmp_path) -> Path:
    """The H100 fixture's recording in a run directory of its own."""
    shutil.copytree(FIXTURE / "trace", tmp_path / "run" / "traces")
    return tmp_path / "run"


def test_a_damaged_export_is_one_line_and_the_rest_merged(run, tmp_path, capsys):
    data = export(deviceProperties=5)
    data["traceEvents"][3]["ts"] = "x"
    data["traceEvents"][6]["args"] = [1, 2]
    path = write(tmp_path / "k.json", data)
    code = report_main([str(run), "--out", str(tmp_path / "out"), "--kineto", str(path),
                        "--jobs", "1"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert err == (f"trace-report: {path}: deviceProperties is int, not a list: ignored; "
                   "1 event dropped (ts missing or not a finite number); 1 event read with "
                   "empty args (args not an object); its other 9 events are used\n")
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["ranks"]["0"]["device"]["activities"] == 2     # the third kernel dropped


def test_an_export_whose_times_cannot_be_placed_leaves_the_rank_its_own(run, tmp_path, capsys):
    path = write(tmp_path / "k.json", export(baseTimeNanoseconds="abc"))
    code = report_main([str(run), "--out", str(tmp_path / "out"), "--kineto", str(path),
                        "--jobs", "1"])
    err = capsys.readouterr().err
    assert code == 1
    assert err.count("\n") == 1 and err.startswith(f"trace-report: {path}: its times are "
                                                   "relative to the profiler's start")
    assert err.endswith("; rank 0 keeps host time\n")
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["ranks"]["0"]["time"]["clock"] == "host"


def test_a_file_that_is_no_export_is_left_out_and_the_rest_analysed(tmp_path, capsys):
    good = write(tmp_path / "good.json", export())
    junk = write(tmp_path / "junk.json", None, "\x00 not json")
    code = report_main([str(tmp_path / "run"), "--kineto", str(good), str(junk), "--jobs", "1"])
    err = capsys.readouterr().err
    assert code == 1
    assert err == f"trace-report: {junk}: not a torch.profiler export (not JSON; torch." \
                  "profiler writes a JSON object with a traceEvents list); left out\n"
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["ranks"]["0"]["device"]["whole"]["kernels"] == 3
    # alone, nothing usable: a usage error
    code = report_main([str(tmp_path / "none"), "--kineto", str(junk)])
    assert code == 2 and capsys.readouterr().err.startswith(
        "trace-report: error: no usable torch.profiler export: ")
    empty = tmp_path / "empty"
    empty.mkdir()
    assert report_main([str(tmp_path / "none"), "--kineto", str(empty)]) == 2
    assert capsys.readouterr().err == f"trace-report: error: --kineto {empty}: no torch." \
                                      "profiler exports (*.json, *.json.gz) in it\n"


def test_hostile_host_events_are_read_past_alone(tmp_path, capsys):
    """An export analysed on its own whose host events carry what no profiler writes: still a
    report, one line, nothing invented."""
    data = export(distributedInfo={"rank": 0, "world_size": 10 ** 7,
                                   "pg_config": [{"pg_name": "0", "ranks": "junk"}]})
    events = data["traceEvents"]
    events[1]["args"] = {"Input Dims": [[10 ** 30, -1], 5], "Input type": [7, None]}
    events[1]["tid"] = "main"
    events[2]["tid"] = "main"
    events[4]["name"] = 12345
    events += [
        {"ph": "X", "cat": "cpu_op", "name": "c10d::send", "pid": 1, "tid": 1, "ts": 500.0,
         "dur": 5.0, "args": {"Concrete Inputs": ["", "", str(10 ** 40), "0"],
                              "Input Dims": [[[10 ** 20]]], "Input type": ["TensorList"]}},
        {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1,
         "ts": 501.0, "dur": 1.0, "args": {"Collective name": "send", "In msg nelems": 10 ** 30,
                                           "dtype": "Float", "Process Group Ranks": "[0, x]",
                                           "Seq": 10 ** 40}},
        {"ph": "f", "cat": "fwdbwd", "id": 10 ** 30, "pid": 1, "tid": 1, "ts": 1.0},
        {"ph": "X", "cat": "python_function", "name": "no frame here", "pid": 1, "tid": 1,
         "ts": 0.0, "dur": 999.0}]
    path = write(tmp_path / "k.json", data)
    code = report_main([str(tmp_path / "run"), "--kineto", str(path), "--jobs", "1"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert err == (f"trace-report: {path}: distributedInfo.world_size is 10000000, not a world "
                   "of rank 0 (at most 1,048,576): ignored; its other 14 events are used\n")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["world_size"] == 1
    (send,) = summary["ranks"]["0"]["comm"]
    assert (send["kind"], send["bytes"]) == ("send", 0)     # 10^30 floats: no byte count
    # the op named 12345 is no op; the one on thread "main" is
    assert summary["ranks"]["0"]["op_counts"] == {"aten.mm": 2, "c10d.send": 1}
