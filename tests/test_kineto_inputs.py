"""Bad and unlucky --kineto inputs: each is one line naming the file, what is wrong and what was
kept, with the documented exit status (docs/kineto.md), never a traceback; one export per rank;
sizes bounded while reading. Constructed exports (a kernel, its launch and its op, as torch
writes them), broken one way each."""
from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path

import pytest

from tracer.kineto.chrome_trace import KinetoError, load_chrome_trace
from tracer.kineto.stream import CHUNK, ExportStream
from viz.cli import report_main

ASSETS = Path(__file__).resolve().parent / "assets"
FIXTURE = ASSETS / "gpu-h100"
BASE = 1_700_000_000_000_000_000


def export(kernels: int = 3, **top) -> dict:
    """A small export: ``kernels`` aten::mm ops, each launching one kernel."""
    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1,
               "tid": 1, "ts": 0.0, "dur": 1000.0, "args": {}}]
    for k in range(kernels):
        t = 10.0 + 100 * k
        events += [
            {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": t,
             "dur": 20.5, "args": {"Input Dims": [[4, 8], [8, 2]],
                                   "Input type": ["float", "float"]}},
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
             "ts": t + 1, "dur": 5.0, "args": {"correlation": 100 + k}},
            {"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": t + 30,
             "dur": 40.25, "args": {"device": 0, "stream": 7, "correlation": 100 + k}}]
    return dict({"schemaVersion": 1, "distributedInfo": {"rank": 0, "world_size": 1},
                 "deviceProperties": [{"name": "GPU"}], "traceEvents": events,
                 "baseTimeNanoseconds": BASE}, **top)


def write(path: Path, data, text: str = None) -> Path:
    text = json.dumps(data, indent=1) if text is None else text
    if path.suffix == ".gz":
        with gzip.open(path, "wt") as fh:
            fh.write(text)
    else:
        path.write_text(text)
    return path


def broken(tmp_path: Path, **kernel_fields) -> Path:
    """An export whose second kernel has ``kernel_fields`` replaced (JSON text, unquoted)."""
    data = export()
    marker = "__BROKEN__"
    data["traceEvents"][6] = dict(data["traceEvents"][6], **{k: marker + k
                                                             for k in kernel_fields})
    text = json.dumps(data, indent=1)
    for key, raw in kernel_fields.items():
        text = text.replace(f'"{marker}{key}"', raw)
    return write(tmp_path / "broken.json", None, text)


# ---------------------------------------------------------------------------- what is read
@pytest.mark.parametrize("fields, note", [
    ({"ts": "Infinity"}, "1 event dropped (ts missing or not a finite number)"),
    ({"ts": "NaN"}, "1 event dropped (ts missing or not a finite number)"),
    ({"ts": "1e300"}, "1 event dropped (ts missing or not a finite number)"),
    ({"ts": '"310.5"'}, "1 event dropped (ts missing or not a finite number)"),
    ({"dur": "-3.5"}, "1 event dropped (dur missing, negative or not a number)"),
    ({"args": "[1, 2]"}, "1 event read with empty args (args not an object)"),
    ({"args": '{"correlation": 123456789012345678901234567890, "stream": 7}'},
     "1 event kept unlinked (device, stream or correlation not a whole number)"),
    ({"args": '{"correlation": 101, "device": 99999999999999999999999, "stream": 7}'},
     "1 event kept unlinked (device, stream or correlation not a whole number)"),
])
def test_an_event_that_cannot_be_read_is_counted_and_the_rest_kept(tmp_path, fields, note):
    records = load_chrome_trace(str(broken(tmp_path, **fields)))
    assert records.meta["damage"] == [note]
    kept = (~records.is_launch).sum()
    assert kept == (2 if "dropped" in note else 3)
    assert (records.end >= records.start).all() and records.start.min() > BASE


def test_a_missing_ts_is_counted(tmp_path):
    data = export()
    del data["traceEvents"][3]["ts"]
    records = load_chrome_trace(str(write(tmp_path / "e.json", data)))
    assert records.meta["damage"] == ["1 event dropped (ts missing or not a finite number)"]


@pytest.mark.parametrize("base", ["abc", None, 1.5])
def test_a_base_time_that_is_no_whole_number_is_ignored_and_said(tmp_path, base):
    with pytest.raises(KinetoError) as err:       # relative times then: nothing places them
        load_chrome_trace(str(write(tmp_path / "e.json", export(baseTimeNanoseconds=base))))
    shown = {"abc": "'abc'", None: "null", 1.5: "1.5"}[base]
    assert "no usable baseTimeNanoseconds" in str(err.value)
    data = export(baseTimeNanoseconds=base)
    for e in data["traceEvents"]:                 # absolute times, as torch before 2.1 wrote
        e["ts"] = e["ts"] + BASE / 1000
    records = load_chrome_trace(str(write(tmp_path / "abs.json", data)))
    assert records.meta["damage"] == [f"baseTimeNanoseconds is {shown}, not a whole number "
                                      "of ns: ignored"]


def test_top_level_fields_of_the_wrong_type_are_ignored_and_said(tmp_path):
    records = load_chrome_trace(str(write(tmp_path / "e.json", export(
        deviceProperties=5, distributedInfo=[1]))))
    assert records.meta["damage"] == ["deviceProperties is int, not a list: ignored",
                                      "distributedInfo is list, not an object: ignored"]
    assert len(records) == 6


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


def test_a_cut_gz_keeps_what_came_before(tmp_path):
    """A real export's .gz cut in the middle (a copy that did not finish)."""
    from tracer.kineto.events import collect
    whole = (ASSETS / "kineto-hta" / "sampled_rank-0.json.gz").read_bytes()
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(whole[:len(whole) // 2])
    events = collect(ExportStream(str(cut)))
    assert events.problem.startswith("the compressed file is cut short or corrupt")
    full = collect(ExportStream(str(ASSETS / "kineto-hta" / "sampled_rank-0.json.gz")))
    assert 0 < events.items < full.items and full.problem is None


def test_the_size_limit_is_checked_while_reading(tmp_path):
    """A small .gz that expands to much more: reading stops at the limit, never reads it all
    into memory first."""
    path = tmp_path / "bomb.json.gz"
    with gzip.open(path, "wt") as fh:
        fh.write('{"traceEvents": [' + " " * (64 << 20))
    assert path.stat().st_size < 200_000
    stream = ExportStream(str(path), limit=4 << 20)
    assert list(stream.events()) == []
    assert stream.problem.startswith("stopped at the size limit of 4 MiB of JSON")
    assert stream.bytes_read <= (4 << 20) + CHUNK
    array = tmp_path / "array.json.gz"
    with gzip.open(array, "wt") as fh:
        fh.write("[" + "0," * (16 << 20) + "0]")
    with pytest.raises(KinetoError, match="a JSON array"):
        list(ExportStream(str(array)).events())


# ---------------------------------------------------------------------------- the command line
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


@pytest.mark.parametrize("how", ["twice", "link", "same rank"])
def test_one_export_per_rank(run, tmp_path, capsys, how):
    """The same export twice doubled every GPU activity; two exports for a rank were merged."""
    path = write(tmp_path / "k.json", export())
    other = write(tmp_path / "other.json", export())
    if how == "twice":
        args, message = [str(path), str(path)], f"--kineto {path}: given twice: each export " \
                                                  "is read once"
    elif how == "link":
        os.symlink(path, tmp_path / "link.json")
        args = [str(path), str(tmp_path / "link.json")]
        message = f"--kineto {tmp_path / 'link.json'}: given twice (the same file as {path}):" \
                  " each export is read once"
    else:
        args = [str(path), f"0={other}"]
        message = f"--kineto {other}: rank 0 has two exports ({path} and {other}): give one " \
                  "export per rank (R=FILE names a file's rank)"
    for where in (run, tmp_path / "alone"):             # merged, and on their own
        code = report_main([str(where), "--out", str(tmp_path / "out"), "--kineto", *args])
        assert (code, capsys.readouterr().err) == (2, f"trace-report: error: {message}\n")
    assert not (tmp_path / "out" / "summary.json").exists()


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
