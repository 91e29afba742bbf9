"""The run's records as files: run.json (tracer.files.run_record), the status file
(tracer.files.status) and the node record (instrument.supervise.gather), each written and read
by one module; and the closed sets they hold (tracer.vocab.outcomes' str Enums), which must
write the bytes plain strings wrote."""
from __future__ import annotations

import json

import pytest

from tracer.vocab.outcomes import (Bystander, FailureKind, HangRule, RankStatus, TraceStatus,
                                   failure)


def test_a_closed_set_writes_and_reads_as_its_values():
    """A member is its value in JSON, str() and f-strings (on every Python: 3.11's mixed-in
    Enum formats as ``FailureKind.HANG``), and equals and hashes as it, so a record read back
    (plain strings) compares with the members."""
    facts = failure(FailureKind.HANG, ranks={2, 1}, cause=HangRule.LEFT_BEHIND, timeout_s=3)
    plain = {"kind": "hang", "ranks": [1, 2], "cause": "left_behind", "site": None,
             "step": None, "timeout_s": 3}
    assert json.dumps(facts, indent=1) == json.dumps(plain, indent=1)
    assert json.dumps({RankStatus.OK: Bystander.WAITING}) == '{"ok": "waiting"}'
    assert f"{FailureKind.HANG}|{HangRule.EXIT:>5}|{TraceStatus.RUNNING!s}" == "hang| exit|running"
    assert str(RankStatus.FAILED) == "failed" and "%s" % TraceStatus.OK == "ok"
    assert {HangRule.COLLECTIVE: 1}["collective"] == 1 and {"ok": 2}[TraceStatus.OK] == 2
    assert json.loads(json.dumps(facts))["cause"] == HangRule.LEFT_BEHIND
    assert failure(FailureKind.ERROR) == {"kind": "error", "ranks": [], "cause": None,
                                          "site": None, "step": None}     # no timeout_s key


def test_the_status_file_reads_back_what_its_writer_wrote(tmp_path):
    """tracer.files.status: write_status's file, read by read_statuses (trace-run's watchdog and
    monitor); a file another writer left half-done, or that holds no object, is skipped."""
    from tracer.files import rundir
    from tracer.files.status import read_statuses, write_status
    launch = {"kind": "all_reduce", "group": [0, 1], "seq": 4, "peer": None, "bytes": 512,
              "t0": 7, "step": 1}
    write_status(rundir.status_file(str(tmp_path), 1), rank=1, status=TraceStatus.RUNNING,
                 step=1, last_event_ns=5, events=96, last_collective=launch,
                 inflight=[launch], failed_collectives=(), error=None,
                 trace=str(tmp_path / "rank-1.arrow"), final=False, config={"steps": 2})
    (tmp_path / "rank-2.status.json").write_text('{"rank": 2, "sta')       # half written
    (tmp_path / "rank-3.status.json").write_text("[3]")
    statuses = read_statuses(str(tmp_path))
    assert list(statuses) == [1]
    status = statuses[1]
    assert list(status) == ["rank", "pid", "now_ns", "status", "step", "last_event_ns",
                            "events", "last_collective", "inflight", "failed_collectives",
                            "error", "trace", "final", "config"]
    assert (status["status"], status["inflight"], status["failed_collectives"],
            status["config"]) == ("running", [launch], [], {"steps": 2})
    assert read_statuses(str(tmp_path / "none")) == {}


def test_run_json_is_written_whole_and_read_back(tmp_path):
    """tracer.files.run_record: the one writer (atomic: no temporary left) and the one reader
    (trace-report's, trace-diff's): a paratrace.run/1 record of sentences still reads, a record
    of another schema or of a wrongly typed field is refused naming the file, and a directory
    without run.json reads as {}."""
    from tracer.files import run_record
    record = {"schema": run_record.SCHEMA, "ranks": {"0": {"status": RankStatus.OK}}}
    path = run_record.write(str(tmp_path), record)
    assert open(path).read() == '{\n "schema": "paratrace.run/2",\n "ranks": {\n  "0": {\n' \
        '   "status": "ok"\n  }\n }\n}'
    assert run_record.read(str(tmp_path)) == record
    assert [p.name for p in tmp_path.iterdir()] == ["run.json"]
    (tmp_path / "run.json").write_text('{"schema": "something/else"}')
    with pytest.raises(run_record.RunRecordError, match=r"run.json: unreadable run record "
                       r"\(schema 'something/else', not a paratrace.run record"):
        run_record.read(str(tmp_path))
    (tmp_path / "run.json").write_text('{"world_size": 0}')
    with pytest.raises(ValueError, match="world_size is 0, not a positive integer"):
        run_record.read(str(tmp_path))
    old = {"schema": "paratrace.run/1", "ranks": {"1": {"status": "failed", "error": "boom"}}}
    (tmp_path / "run.json").write_text(json.dumps(old))
    assert run_record.read(str(tmp_path)) == old
    (tmp_path / "run.json").unlink()
    assert run_record.read(str(tmp_path)) == {}
    with pytest.raises(OSError):
        run_record.write(str(tmp_path / "no-such-dir"), record)
