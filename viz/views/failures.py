"""How a run ended, in words, from the facts trace-run wrote into run.json (their vocabulary:
tracer.vocab.outcomes): a rank's failure (:func:`failure_text`, :func:`reported_error`), the
first failure (:func:`first_failure_line`; :func:`by_cause` orders failed ranks so: the first
failure, then the ranks that failed after it), a hang (:func:`watchdog_line`, :func:`banner`).
One home for these words, beside :mod:`.problems`, which words what the analysis found and
takes these from here: trace-run's lines on the terminal, the report's banners and
summary.json's rank errors say the same thing. A run.json written before run.json held facts
has a sentence in a rank's ``error`` instead of a ``failure``: it is read as it was written.
Torch-free and light: trace-run imports it once its workers have run, never while they run."""
from __future__ import annotations

from typing import Any, Mapping, Optional

from tracer.vocab.ops import P2P_KINDS
from tracer.vocab.outcomes import Bystander, FailureKind, HangRule, RankStatus

# a hang failure's cause, as the rank's error says it: "hang: ended by --timeout S (<cause>)"
HANG_CAUSES = {HangRule.COLLECTIVE: "never arrived at the collective the others waited in",
               HangRule.LEFT_BEHIND: "recorded nothing after the other ranks finished",
               HangRule.EXIT: "closed its trace but did not exit",
               Bystander.FINISHED: "had finished, ended while exiting",
               Bystander.WAITING: "waiting"}


def _join(ranks) -> str:
    return ", ".join(map(str, ranks))


def _ranks(ranks) -> str:
    return f"rank{'s' if len(ranks) != 1 else ''} {_join(ranks)}"


def _seconds(value) -> str:
    """Seconds as trace-run's options take them: 3, 2.5."""
    return f"{value:g}" if isinstance(value, (int, float)) else str(value)


def failure_text(failure: Mapping[str, Any], exit_code: Optional[int] = None) -> Optional[str]:
    """A rank's failure in words (``exit_code``: the rank's, which says an error that came with
    no message): ``ValueError: boom``, ``ended by the launcher after rank 0 failed; its own
    end: ...``, ``exited with status 0 (os._exit) in step 2 while rank 0 waited in all_reduce
    #8``, ``hang: ended by --timeout 3 (waiting)``, ``interrupted``, why the launch failed."""
    kind, cause = failure.get("kind"), failure.get("cause")
    own = cause or f"exit code {exit_code}"
    if kind == FailureKind.ERROR:
        return own
    if kind == FailureKind.ENDED:
        return (f"ended by the launcher after rank {_join(failure.get('ranks') or [])} failed; "
                f"its own end: {own}")
    if kind == FailureKind.EXITED:
        return _exited(failure, exit_code)
    if kind == FailureKind.HANG:
        if cause is None:            # a rank torch's agent did not report
            return "ended by the watchdog (hang)"
        return (f"hang: ended by --timeout {_seconds(failure.get('timeout_s'))} "
                f"({HANG_CAUSES.get(cause, cause)})")
    if kind == FailureKind.INTERRUPTED:
        return "interrupted"
    return cause                     # the launch's error; a kind unknown here: its cause


def _exited(failure: Mapping[str, Any], exit_code: Optional[int]) -> str:
    """``exited with status N (os._exit) in step K while rank Q waited in all_reduce #S``
    (a send or receive has no #S: its sequence numbers count apart)."""
    waiters, site = failure.get("ranks") or [], failure.get("site") or {}
    kind, seq = site.get("kind"), site.get("seq")
    return (f"exited with status {exit_code} ({failure.get('cause')}) in step "
            f"{failure.get('step')} while rank{'s' if len(waiters) > 1 else ''} "
            f"{_join(waiters)} waited in {kind}"
            + (f" #{seq}" if seq is not None and kind not in P2P_KINDS else ""))


def reported_error(record: Mapping[str, Any], rank: int | str) -> Optional[str]:
    """How run.json (``record``) says ``rank`` ended, in words; None when it says nothing. A
    run.json written before run.json held facts holds the sentence itself (``error``)."""
    entry = (record.get("ranks") or {}).get(str(rank)) or {}
    if isinstance(entry.get("failure"), dict):
        return failure_text(entry["failure"], entry.get("exit_code"))
    return entry.get("error")


def rank_failed(rank, error: Optional[str]) -> str:
    """``rank R failed: ERROR``: how a failed rank is named everywhere."""
    return f"rank {rank} failed: {error or 'no error recorded'}"


def by_cause(record: Mapping[str, Any], failed: list[Any],
             ended_unix: Optional[dict[Any, float]] = None) -> list[Any]:
    """``failed`` ranks in the order of cause: the first failure first (run.json's
    ``first_failure``, the one trace-run names; without run.json, the rank whose trace ended
    first by ``ended_unix``, rank -> its trace's ``end_unix``, as trace-run decides across
    nodes), then the ranks that failed after it, in rank order."""
    ranks = sorted(failed, key=int)
    named = record.get("first_failure")
    first = next((r for r in ranks if named is not None and str(r) == str(named)), None)
    if first is None and ended_unix:
        known = [r for r in ranks if isinstance(ended_unix.get(r), (int, float))]
        first = min(known, key=lambda r: (ended_unix[r], int(r))) if known else None
    if first is None:
        return ranks
    return [first] + [r for r in ranks if r != first]


def first_failure_line(record: Mapping[str, Any], local: set[str]) -> Optional[str]:
    """trace-run's one line for the ranks that failed on their own (not ended by the launcher
    or the watchdog): the first failure, and which ranks failed after it (their errors are in
    run.json); None when none did, or when a hang or an interruption ended the run (those have
    lines of their own). ``local``: the ranks of this node."""
    if record["hang"] is not None or record["interrupted"]:
        return None
    failed = [r for r, info in record["ranks"].items()
              if info["status"] == RankStatus.FAILED and not info.get("terminated")]
    if not failed:
        return None
    first, *after = by_cause(record, failed)
    error = reported_error(record, first)
    line = rank_failed(first, error) if first in local else \
        f"first failure, on another node: rank {first}: {error}"
    if after:
        line += f"; then rank(s) {', '.join(after)} failed too (errors in run.json)"
    return line


def watchdog_line(hang: Mapping[str, Any]) -> str:
    """The one line trace-run prints when its watchdog ended a run (run.json's ``hang``; its
    ``finished``: the ranks whose trace had closed ``ok``)."""
    timeout = f"{_seconds(hang['timeout_s'])}s"
    lingering, finished = hang.get("lingering") or [], hang.get("finished") or []
    if hang["kind"] == HangRule.COLLECTIVE:
        if not hang["never_arrived"]:     # all in: they disagree on it, or the backend hangs
            return (f"no rank made progress for {timeout}: every rank waits in a collective and "
                    "none is missing from it (ranks that disagree on a collective hang so: the "
                    "report checks); ending the workers")
        return (f"no rank made progress for {timeout}: rank(s) {_join(hang['never_arrived'])} "
                "never arrived at the collective the others wait in; ending the workers")
    if hang["kind"] == HangRule.LEFT_BEHIND:
        return (f"rank(s) {_join(lingering)} recorded nothing for {timeout} after rank(s) "
                f"{_join(finished)} finished; ending the workers")
    return (f"rank(s) {_join(lingering)} closed the trace but did not exit for "
            f"{_seconds(hang['exit_grace_s'])}s; ending them")


def banner(hang: Mapping[str, Any]) -> str:
    """The report's banner: ranks that never arrived at the collective the others waited in,
    ranks left behind after their peers finished, or ranks that closed their trace but never
    exited."""
    never, behind = hang.get("never_arrived") or [], hang.get("lingering") or []
    timeout = f" (watchdog timeout {hang.get('timeout_s')} s)" if hang.get("timeout_s") else ""
    kind = hang.get("kind")
    if kind == HangRule.LEFT_BEHIND and behind:
        return f"Hang: {_ranks(behind)} recorded nothing after the others finished{timeout}"
    if kind == HangRule.EXIT and behind:
        return f"Hang: {_ranks(behind)} closed the trace but did not exit{timeout}"
    if not never:
        return f"Hang: every rank waited in a collective, none was missing from it{timeout}"
    return f"Hang: {_ranks(never)} never arrived{timeout}"
