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
from support.paths import ASSETS
from support.kineto_exports import BASE, export, write

FIXTURE = ASSETS / "gpu-h100"


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
    ({"ts": "0", "dur": "0"}, "1 event dropped (ts and dur 0: a time Kineto clamped to its base)"),
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


def test_a_window_kineto_clamped_is_said_not_placed_at_its_base(tmp_path):
    # what Kineto writes for a window saved after the next one was enabled (seen on an H200,
    # torch 2.11): every CUPTI time 0, so every activity would sit at the base, 56 days back
    data = export()
    device = [e for e in data["traceEvents"] if e.get("cat") in ("kernel", "cuda_runtime")]
    for e in device:
        e["ts"], e["dur"] = 0, 0
    records = load_chrome_trace(str(write(tmp_path / "w.json", data)))
    assert len(records) == 0
    assert records.meta["damage"] == [f"{len(device)} events dropped (ts and dur 0: a time "
                                      "Kineto clamped to its base)"]
    data = export()                      # a zero-length activity at a real time is kept
    device = [e for e in data["traceEvents"] if e.get("cat") == "kernel"]
    device[0]["dur"] = 0
    records = load_chrome_trace(str(write(tmp_path / "z.json", data)))
    assert records.meta["damage"] == [] and (records.start > BASE).all()


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


