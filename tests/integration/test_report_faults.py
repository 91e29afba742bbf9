"""trace-report and trace-diff on runs a user can really end up with: truncated, garbage, empty,
newer-format and unclosed traces, a directory without traces, a read-only run directory.

Each fault gives one line per damaged or missing trace on stderr (naming the file, what is
wrong and what was kept), a report built from what was readable, and the documented exit
status: 0 when every rank's trace was at least partly read, 1 when some rank's could not be
read at all, 2 for bad input (no readable trace, not a run directory, nowhere to write).
Traces are constructed (constructed.synthetic), so every count below is exact.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

import tracer
from tracer.files import rundir
from tracer.files.format import FORMAT_NAME, META_KEY, SCHEMA, read_stream
from support.constructed.synthetic import SyntheticRank

STEPS, OPS_PER_STEP = 3, 40
BATCH = 20                       # rows per batch: a truncation keeps the batches before it


def console(name: str, *args: str) -> subprocess.CompletedProcess:
    """An installed console script, as users run it."""
    script = os.path.join(os.path.dirname(sys.executable), name)
    command = script if os.path.exists(script) else shutil.which(name)
    assert command, f"{name} is not installed (pip install -e .)"
    return subprocess.run([command, *args], capture_output=True, text=True, timeout=240)


def two_ranks(directory: Path, world: int = 2) -> Path:
    """A healthy constructed run of two ranks: ops, an all-reduce per step, step markers;
    ``world``: the world size their metadata says (ranks 2.. then have no trace)."""
    ranks = []
    for rank in (0, 1):
        r = SyntheticRank(rank, world, {"tp": 2, "pp": 1, "dp": 1})
        t = 0
        for step in range(STEPS):
            for _ in range(OPS_PER_STEP):
                r.op(t, t + 5, stack=[("/src/train.py", 10 + step, "train", "train")])
                t += 6
            r.comm("all_reduce", t, t + 1, t + 20, group=(0, 1), nbytes=4096)
            t += 25
            r.next_step(t)
        ranks.append(r)
    for r in ranks:
        r.write(directory / "traces", batch_rows=BATCH)
    return directory


def lines(proc: subprocess.CompletedProcess) -> list:
    return [line for line in proc.stderr.splitlines() if line]


def summary(directory: Path) -> dict:
    return json.loads((directory / rundir.SUMMARY).read_text())


@pytest.fixture
def run(tmp_path) -> Path:
    return two_ranks(tmp_path / "run")


def trace_file(run: Path, rank: int) -> Path:
    return Path(rundir.trace_file(str(run / "traces"), rank))


def test_healthy_run_is_silent_and_exits_0(run):
    proc = console("trace-report", str(run))
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert proc.stdout.strip() == str(run / "index.html")


def test_truncated_trace_keeps_its_intact_batches_and_exits_0(run):
    path = trace_file(run, 0)
    data = path.read_bytes()
    path.write_bytes(data[:len(data) * 2 // 3])
    kept = len(tracer.load(str(path)))
    assert 0 < kept < STEPS * (OPS_PER_STEP + 2)
    proc = console("trace-report", str(run))
    assert proc.returncode == 0, proc.stderr
    line, = lines(proc)
    assert line.startswith(f"trace-report: {path}: truncated or corrupt after {kept:,} events")
    assert f"those {kept:,} events are used" in line and "Traceback" not in proc.stderr
    # the collectives of the lost tail cannot be matched with rank 1's: said on the same line,
    # not miscalled a mismatch
    assert line.endswith("; the trace ends before 2 collective(s) the other ranks issued "
                         "(from #1 of group [0,1]), not compared"), line
    ranks = summary(run)["ranks"]
    assert ranks["0"]["events"] == kept and ranks["0"]["warnings"]
    assert ranks["1"]["status"] == "ok" and "warnings" not in ranks["1"]


def test_garbage_and_truncated_traces_are_both_named_and_exit_1(run):
    trace_file(run, 1).write_bytes(b"\x00garbage, not an Arrow stream" * 40)
    path = trace_file(run, 0)
    path.write_bytes(path.read_bytes()[:-300])
    proc = console("trace-report", str(run))
    assert proc.returncode == 1, proc.stderr
    got = lines(proc)
    assert len(got) == 2, got
    assert any(f"{path}: truncated or corrupt after" in line for line in got)
    assert any(f"{trace_file(run, 1)}: not a paratrace trace file" in line
               and "rank 1 is left out" in line for line in got)
    assert proc.stdout.strip() == str(run / "index.html")
    ranks = summary(run)["ranks"]
    assert ranks["1"]["status"] == "missing" and ranks["0"]["events"] > 0
    html = (run / "index.html").read_text()
    assert "rank 1: no trace" in html and "truncated or corrupt" in html


def test_empty_file_is_named_and_exits_1(run):
    trace_file(run, 1).write_bytes(b"")
    proc = console("trace-report", str(run))
    assert proc.returncode == 1
    (line,) = lines(proc)
    assert f"{trace_file(run, 1)}: empty file (0 bytes)" in line, line


def test_a_fifo_is_named_for_what_it_is_and_exits_1(run):
    path = trace_file(run, 1)
    path.unlink()
    os.mkfifo(path)
    proc = console("trace-report", str(run))
    assert proc.returncode == 1
    (line,) = lines(proc)
    assert line == (f"trace-report: {path}: a FIFO (named pipe), not a trace file; rank 1 is "
                    "left out")


def test_newer_format_is_named_and_exits_1(run):
    """A trace written by a later paratrace: the format's own header, a higher version."""
    path = trace_file(run, 1)
    header = {b"paratrace.format": FORMAT_NAME.encode(), b"paratrace.version": b"9",
              META_KEY: b"{}"}
    with pa.OSFile(str(path), "wb") as sink, \
            pa.ipc.new_stream(sink, SCHEMA.with_metadata(header)):
        pass
    proc = console("trace-report", str(run))
    assert proc.returncode == 1
    (line,) = lines(proc)
    assert f"{path}: trace format version 9 is newer than this paratrace reads" in line, line


def test_unclosed_trace_of_a_killed_rank_is_named_and_exits_0(tmp_path):
    r = SyntheticRank(0, 1)
    r.op(0, 10)
    path = r.write(tmp_path, status=None)        # the writer never closed: SIGKILL
    proc = console("trace-report", str(tmp_path))
    assert proc.returncode == 0
    (line,) = lines(proc)
    assert f"{path}: the recording never closed" in line
    assert summary(tmp_path)["ranks"]["0"]["status"] == "failed"


def test_a_missing_rank_of_the_world_is_named_and_exits_1(tmp_path):
    run = two_ranks(tmp_path / "run", world=3)
    (run / rundir.RUN_RECORD).write_text(json.dumps({"world_size": 3}))
    proc = console("trace-report", str(run))
    assert proc.returncode == 1
    (line,) = lines(proc)
    assert line == f"trace-report: rank 2: no trace file in {run / 'traces'}"
    assert summary(run)["missing_ranks"] == [[2, 2]] and "2" not in summary(run)["ranks"]


@pytest.mark.parametrize("world", [1000, 10**7])
def test_a_world_of_missing_ranks_is_one_line_not_one_per_rank(tmp_path, world):
    """Two traces of a world of 10^7 ranks (their own metadata says so): runs of absent ranks
    in every output, nothing written or held per absent rank."""
    run = two_ranks(tmp_path / "run", world=world)
    proc = console("trace-report", str(run))
    assert proc.returncode == 1
    assert lines(proc) == [f"trace-report: ranks 2-{world - 1}: no trace file in "
                           f"{run / 'traces'}"]
    html = (run / "index.html").read_text()
    assert html.count('class="banner missing"') == 1 and f"ranks 2-{world - 1}: no trace" in html
    assert html.count(f"<td>2-{world - 1}</td>") == 2          # one row in each rank table
    got = summary(run)
    assert (got["world_size"], list(got["ranks"]), got["missing_ranks"]) == \
        (world, ["0", "1"], [[2, world - 1]])
    for page in ("index.html", "summary.json", "crossrank.html", "modules.html"):
        assert (run / page).stat().st_size < 100_000, page


def test_a_forged_world_size_in_run_json_is_named_and_set_aside(run):
    """20 bytes of run.json saying a million ranks beside 2 traces of a world of 2 (once: a
    614 MB index.html, a 296 MB summary.json, 79 s and 2.3 GB)."""
    (run / rundir.RUN_RECORD).write_text('{"world_size": 1000000}')
    proc = console("trace-report", str(run))
    assert proc.returncode == 0, proc.stderr
    assert lines(proc) == [f"trace-report: {run / 'run.json'}: world_size 1000000 does not "
                           "match the traces (the traces say 2); the report uses 2"]
    got = summary(run)
    assert (got["world_size"], list(got["ranks"]), got["missing_ranks"]) == (2, ["0", "1"], [])
    html = (run / "index.html").read_text()
    assert "world_size 1000000 does not match the traces" in html
    assert (run / "index.html").stat().st_size < 100_000


def test_traces_whose_metadata_names_another_rank_are_left_out(tmp_path):
    """Renamed or copied files: a trace is used only as the rank its own metadata names, and a
    stray high-numbered copy does not make the world that large (it once made 99,998 lines)."""
    run = two_ranks(tmp_path / "run")
    traces = run / "traces"
    SyntheticRank(2, 3).write(tmp_path / "third")
    shutil.copy(traces / "rank-1.arrow", traces / "rank-100000.arrow")
    shutil.copy(traces / "rank-1.arrow", traces / "rank-01.arrow")     # not a rank file name
    proc = console("trace-report", str(run))
    assert proc.returncode == 1
    assert lines(proc) == [f"trace-report: {traces / 'rank-100000.arrow'}: its metadata says "
                           "rank 1, not 100000 (renamed, or copied from another run); rank "
                           "100000 is left out"]
    assert summary(run)["world_size"] == 2
    # two ranks' files swapped: neither is used as the other, and the run says so
    os.replace(traces / "rank-100000.arrow", tmp_path / "spare")
    os.replace(traces / "rank-0.arrow", tmp_path / "zero")
    os.replace(traces / "rank-1.arrow", traces / "rank-0.arrow")
    os.replace(tmp_path / "zero", traces / "rank-1.arrow")
    shutil.copy(tmp_path / "third" / "rank-2.arrow", traces / "rank-2.arrow")
    proc = console("trace-report", str(run))
    assert proc.returncode == 1
    assert lines(proc) == [
        f"trace-report: {traces / f'rank-{r}.arrow'}: its metadata says rank {1 - r}, not {r} "
        f"(renamed, or copied from another run); rank {r} is left out" for r in (0, 1)]


@pytest.mark.parametrize("case, reason", [
    ("no traces", "no trace files (rank-<R>.arrow) found"),
    ("all unreadable", "no readable trace"),
    ("not a directory", "no such run directory"),
    ("traces a file", "traces: not a directory (a run's traces go there)"),
])
def test_bad_run_directories_are_one_line_and_exit_2(tmp_path, case, reason):
    target = tmp_path / "run"
    if case == "no traces":
        target.mkdir()
    elif case == "traces a file":
        target.mkdir()
        (target / "traces").write_text("not a directory")
    elif case == "all unreadable":
        (target / "traces").mkdir(parents=True)
        (target / "traces" / "rank-0.arrow").write_bytes(b"junk")
    proc = console("trace-report", str(target))
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"trace-report: error: {target}") and reason in proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stdout == ""


@pytest.mark.parametrize("record, reason", [
    ({"world_size": "two"}, "world_size is 'two', not a positive integer"),
    ({"world_size": 2.5}, "world_size is 2.5, not a positive integer"),
    ({"world_size": True}, "world_size is True, not a positive integer"),
    ({"ranks": [0, 1]}, "ranks is list, not an object keyed by rank"),
    ({"ranks": {"0": "x"}}, "ranks['0'] is str, not an object"),
    ({"ranks": {"zero": {}}}, "ranks has the key 'zero', not a rank"),
    ({"ranks": {"0": {"exit_code": "1"}}}, "ranks['0'].exit_code is '1', not an integer"),
    ({"hang": 5}, "hang is int, not an object"),
    ({"hang": {"never_arrived": "1"}}, "hang.never_arrived is '1', not a list of ranks"),
    ({"hang": {"ranks": {"0": 3}}}, "hang.ranks['0'] is int, not an object"),
    ({"ranks": {"0": {"failure": "boom"}}}, "ranks['0'].failure is str, not an object"),
    ({"ranks": {"0": {"failure": {"kind": "error", "ranks": "1"}}}},
     "ranks['0'].failure.ranks is '1', not a list of ranks"),
    ({"hang": {"finished": [0.5]}}, "hang.finished is [0.5], not a list of ranks"),
    ({"command": 7}, "command is int, not a string or a list"),
])
def test_wrongly_typed_run_record_is_one_line_and_exit_2(run, record, reason):
    """A hand-edited or foreign run.json: its first unusable field named, not a traceback."""
    (run / rundir.RUN_RECORD).write_text(json.dumps(record))
    for name in ("trace-report", "trace-diff"):
        proc = console(name, str(run), *([str(run)] if name == "trace-diff" else []))
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr == (f"{name}: error: {run / rundir.RUN_RECORD}: unreadable run "
                               f"record ({reason})\n")


def _read_only(path: Path, *command: str) -> subprocess.CompletedProcess:
    """Run ``command`` with ``path`` on a read-only bind mount (a user and mount namespace of
    its own: root's permission checks ignore chmod, a read-only mount stops everyone)."""
    script = f'mount --bind "{path}" "{path}" && mount -o remount,bind,ro "{path}" && exec "$@"'
    return subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
                           script, "sh", *command], capture_output=True, text=True, timeout=240)


def test_read_only_run_directory_says_where_to_write_instead(run, tmp_path):
    report = os.path.join(os.path.dirname(sys.executable), "trace-report")
    proc = _read_only(run, report, str(run))
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == f"trace-report: error: {run}: output directory is not writable " \
                          "(write elsewhere with --out DIR)\n"
    elsewhere = tmp_path / "elsewhere"
    proc = _read_only(run, report, str(run), "--out", str(elsewhere))
    assert proc.returncode == 0, proc.stderr
    assert (elsewhere / "index.html").exists() and not (run / "index.html").exists()


@pytest.mark.parametrize("what, message", [
    ("garbage", "{path}: not a torch.profiler export"),
    ("a directory", "--kineto {path}: no torch.profiler exports (*.json, *.json.gz) in it"),
])
def test_a_kineto_argument_that_is_no_export_says_so(run, tmp_path, what, message):
    """On a run of two ranks, before asking which rank an export is."""
    path = tmp_path / "export"
    if what == "garbage":
        path.write_bytes(b"\x00 not json")
    else:
        path.mkdir()
    proc = console("trace-report", str(run), "--out", str(tmp_path / "out"), "--kineto",
                   str(path))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("trace-report: error: " + message.format(path=path))


def test_a_report_is_not_written_over_another_runs(run, tmp_path):
    other = two_ranks(tmp_path / "other")
    before = {p.name: p.read_bytes() for p in other.rglob("*") if p.is_file()}
    proc = console("trace-report", str(run), "--out", str(other))
    assert proc.returncode == 2
    assert proc.stderr == f"trace-report: error: --out {other} is another run's directory; its " \
                          "report would be overwritten (choose a new DIR)\n"
    assert {p.name: p.read_bytes() for p in other.rglob("*") if p.is_file()} == before
    # its own directory, given as --out, is where the report goes by default
    assert console("trace-report", str(run), "--out", str(run)).returncode == 0


def test_trace_diff_names_damage_per_run_and_exits_1(tmp_path):
    a = two_ranks(tmp_path / "a")
    b = two_ranks(tmp_path / "b")
    trace_file(b, 1).write_bytes(b"junk" * 100)
    proc = console("trace-diff", str(a), str(b), "--out", str(tmp_path / "diff"))
    assert proc.returncode == 1, proc.stderr
    (line,) = lines(proc)
    assert line.startswith(f"trace-diff: run B: {trace_file(b, 1)}: not a paratrace trace")
    assert (tmp_path / "diff" / "diff.html").exists()
    data = json.loads((tmp_path / "diff" / "diff.json").read_text())
    assert any("run B has no readable trace for ranks 1:" in w for w in data["warnings"])


def test_constructed_runs_are_written_in_batches(run):
    """The premise of the truncation tests: BATCH rows a batch, so a cut loses only the tail."""
    _, _, batches, _, _ = read_stream(str(trace_file(run, 0)))
    rows = [len(b) for b in batches if len(b)]
    assert rows[:-1] == [BATCH] * (len(rows) - 1) and 0 < rows[-1] <= BATCH


def test_a_bug_in_trace_report_is_one_line_and_exit_70(tmp_path):
    """trace-report through its console script's function (tracer.vocab.console_errors), with
    the build made to fail as a rendering bug would."""
    code = ("import sys, viz.cli as cli\n"
            "def bad(*a, **k): raise RuntimeError('boom')\n"
            "cli.build = bad\n"
            "sys.argv = ['trace-report', sys.argv[1]]\n"
            "sys.exit(cli.report_console())\n")
    run = tmp_path / "run"
    run.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PARATRACE_TRACEBACK"}
    proc = subprocess.run([sys.executable, "-c", code, str(run)], capture_output=True,
                          text=True, env={**env, "TMPDIR": str(tmp_path)})
    assert proc.returncode == 70, proc.stderr
    assert proc.stderr.startswith("trace-report: internal error: RuntimeError: boom (at ")
    assert proc.stderr.count("\n") == 1


# graphviz 2.43's own words for the label it refused on HTA's trace_diff export (issue 50)
DOT_REFUSAL = ("Error: <stdin>: syntax error in line 10 scanning a quoted string (missing "
               "endquote? longer than 16384?)")


def test_a_picture_dot_fails_on_is_one_line_naming_its_page(run, tmp_path):
    """graphviz's dot failing (a stand-in on PATH that fails as dot 2.43 did): one line per
    call-graph page naming it, that page saying so, the rest of the report written, exit 0;
    before, an internal error (str has no decode) and no report."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "dot").write_text(f"#!/bin/sh\ncat >/dev/null\necho '{DOT_REFUSAL}' >&2\nexit 1\n")
    (fake / "dot").chmod(0o755)
    script = os.path.join(os.path.dirname(sys.executable), "trace-report")
    command = script if os.path.exists(script) else shutil.which("trace-report")
    proc = subprocess.run([command, str(run)], capture_output=True, text=True, timeout=240,
                          env={**os.environ, "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}"})
    assert proc.returncode == 0, proc.stderr
    pages = sorted(p.relative_to(run).as_posix() for p in (run / "callgraphs").glob("*.html"))
    assert pages and sorted(lines(proc)) == [
        f"trace-report: {page}: its picture was not drawn: graphviz dot failed: {DOT_REFUSAL}"
        for page in pages]
    assert not list((run / "callgraphs").glob("*.svg"))
    assert "picture was not drawn" in (run / "callgraphs" / "all.html").read_text()
    for name in ("index.html", "summary.json", "modules.html", "timeline.svg"):
        assert (run / name).stat().st_size > 0
    assert "callgraphs/all.html: its picture was not drawn" in (run / "index.html").read_text()
