"""The run's records as files: run.json (tracer.files.run_record), the status file
(tracer.files.status) and the node record (instrument.supervise.gather), each written and read
by one module; and the closed sets they hold (tracer.vocab.outcomes' str Enums), which must
write the bytes plain strings wrote."""
from __future__ import annotations

import json

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
