"""A hang in words, from run.json's ``hang`` (instrument/watchdog.py writes it): the line
trace-run prints when its watchdog ends a run, each rank's error in run.json, and the report's
banner. One home for the wording, so the terminal, run.json and the report say the same thing;
torch-free and light (trace-run's watchdog imports it while the workers run).

The hang's ``kind``: ``collective`` (no rank made progress; ``never_arrived`` names the ranks
that never reached the collective the others wait in), ``left_behind`` (``lingering`` ranks
recorded nothing after the others finished), ``exit`` (``lingering`` ranks closed their trace
but did not exit)."""
from __future__ import annotations

COLLECTIVE, LEFT_BEHIND, EXIT = "collective", "left_behind", "exit"

# run.json's error of a rank the watchdog blamed: "hang: ended by --timeout S (<cause>)"
CAUSES = {COLLECTIVE: "never arrived at the collective the others waited in",
          LEFT_BEHIND: "recorded nothing after the other ranks finished",
          EXIT: "closed its trace but did not exit"}


def _join(ranks) -> str:
    return ", ".join(map(str, ranks))


def _ranks(ranks) -> str:
    return f"rank{'s' if len(ranks) != 1 else ''} {_join(ranks)}"


def watchdog_line(hang: dict, finished: list) -> str:
    """The one line trace-run prints when the watchdog ends a run (``finished``: the ranks whose
    trace had closed ``ok``)."""
    timeout = f"{hang['timeout_s']:g}s"
    lingering = hang.get("lingering") or []
    if hang["kind"] == COLLECTIVE:
        if not hang["never_arrived"]:     # all in: they disagree on it, or the backend hangs
            return (f"no rank made progress for {timeout}: every rank waits in a collective and "
                    "none is missing from it (ranks that disagree on a collective hang so: the "
                    "report checks); ending the workers")
        return (f"no rank made progress for {timeout}: rank(s) {_join(hang['never_arrived'])} "
                "never arrived at the collective the others wait in; ending the workers")
    if hang["kind"] == LEFT_BEHIND:
        return (f"rank(s) {_join(lingering)} recorded nothing for {timeout} after rank(s) "
                f"{_join(finished)} finished; ending the workers")
    return (f"rank(s) {_join(lingering)} closed the trace but did not exit for "
            f"{hang['exit_grace_s']:g}s; ending them")


def rank_error(hang: dict, culprit: bool, finished_ok: bool) -> str:
    """run.json's error of a rank the watchdog ended: the cause for a rank it blamed
    (``culprit``), else what the rank was doing (``finished_ok``: its trace had closed ok)."""
    if culprit:
        cause = CAUSES[hang.get("kind", COLLECTIVE)]
    elif finished_ok:
        cause = "had finished, ended while exiting"
    else:
        cause = "waiting"
    return f"hang: ended by --timeout {hang['timeout_s']:g} ({cause})"


def banner(hang: dict) -> str:
    """The report's banner: ranks that never arrived at the collective the others waited in,
    ranks left behind after their peers finished, or ranks that closed their trace but never
    exited."""
    never, behind = hang.get("never_arrived") or [], hang.get("lingering") or []
    timeout = f" (watchdog timeout {hang.get('timeout_s')} s)" if hang.get("timeout_s") else ""
    kind = hang.get("kind")
    if kind == LEFT_BEHIND and behind:
        return f"Hang: {_ranks(behind)} recorded nothing after the others finished{timeout}"
    if kind == EXIT and behind:
        return f"Hang: {_ranks(behind)} closed the trace but did not exit{timeout}"
    if not never:
        return f"Hang: every rank waited in a collective, none was missing from it{timeout}"
    return f"Hang: {_ranks(never)} never arrived{timeout}"
