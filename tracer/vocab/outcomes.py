"""How a rank's run ended, as trace-run's run.json records it: facts, never sentences
(docs/trace-run.md). instrument writes them (run_outcome, watchdog, single); viz reads them and
words them, once (viz.views.failures). Torch-free and light: trace-run's watchdog uses it while
the workers run.

The closed sets are str Enums (:class:`FailureKind`, :class:`HangRule`, :class:`Bystander`,
:class:`RankStatus`, :class:`TraceStatus`): written to JSON as their values, equal to the plain
strings a reader gets back.

A rank that failed has a ``failure`` (:func:`failure`): what happened to it (``kind``), the
other ranks it involved (``ranks``), why (``cause``), where (``site``, a collective) and when
(``step``); empty or null where they do not apply:

- ``error``: it failed on its own (raised, killed by a signal, exited non-zero); ``cause``: the
  error torch's agent, or its tracer without a launcher, reported (null: none, its exit code
  says it all);
- ``ended``: the launcher ended it after rank ``ranks[0]`` failed; ``cause``: its own end, as
  for ``error``;
- ``exited``: it left through os._exit or sys.exit (``cause``) in step ``step`` while
  ``ranks`` waited for it in the collective ``site`` (``{"kind", "group", "seq", "peer"}``);
- ``hang``: the watchdog ended it after ``timeout_s`` seconds (``--timeout``); ``ranks``: the
  ranks it blamed; ``cause``: the rule that blamed this rank (:class:`HangRule`), else what
  the rank was doing (:class:`Bystander`), null where torch's agent did not report the rank;
- ``interrupted``: Ctrl-C or SIGTERM to trace-run stopped it;
- ``launch``: the launch itself failed; ``cause``: why.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional, TypedDict

from .strenum import StrEnum


class FailureKind(StrEnum):
    """What happened to a rank that failed (the module docstring says each)."""

    ERROR = "error"
    ENDED = "ended"
    EXITED = "exited"
    HANG = "hang"
    INTERRUPTED = "interrupted"
    LAUNCH = "launch"


class HangRule(StrEnum):
    """The watchdog's rules (run.json's ``hang["kind"]``; docs/trace-run.md): no rank made
    progress while some waited in a collective; a rank recorded nothing after others finished;
    a rank closed its trace but did not exit. A hang failure's cause for a rank the rule
    blamed."""

    COLLECTIVE = "collective"
    LEFT_BEHIND = "left_behind"
    EXIT = "exit"


class Bystander(StrEnum):
    """A hang failure's cause for a rank the watchdog did not blame: its trace had closed ok (it
    was exiting), or it was waiting for the ranks blamed."""

    FINISHED = "finished"
    WAITING = "waiting"


class RankStatus(StrEnum):
    """How a rank ended, in run.json's ``ranks[R]["status"]``."""

    OK = "ok"
    FAILED = "failed"


class TraceStatus(StrEnum):
    """How a rank's tracer closed its trace (a trace's ``status``, its status file's, run.json's
    ``tracer_status``); ``running`` until it closes."""

    RUNNING = "running"
    OK = "ok"
    FAILED = "failed"
    INTERRUPTED = "interrupted"


class Site(TypedDict):
    """The collective an ``exited`` failure's waiters waited in."""

    kind: Optional[str]
    group: Optional[str]
    seq: Optional[int]
    peer: Optional[int]


class Failure(TypedDict, total=False):
    """run.json's ``failure`` of a rank (:func:`failure` writes every key but ``timeout_s``,
    which only a hang has)."""

    kind: str
    ranks: list[int]
    cause: Optional[str]
    site: Optional[Site]
    step: Optional[int]
    timeout_s: float


def failure(kind: FailureKind, *, ranks: Iterable[int] = (), cause: Optional[str] = None,
            site: Optional[Site] = None, step: Optional[int] = None,
            timeout_s: Optional[float] = None) -> Failure:
    """run.json's ``failure`` of a rank; ``timeout_s``: a hang's."""
    facts: Failure = {"kind": kind, "ranks": sorted(ranks), "cause": cause, "site": site,
                      "step": step}
    if timeout_s is not None:
        facts["timeout_s"] = timeout_s
    return facts


def hang_blamed(hang: Mapping[str, Any]) -> list[int]:
    """The ranks a hang blames: those that never arrived at the collective the others waited
    in, else those left behind or that did not exit."""
    return list(hang.get("never_arrived") or hang.get("lingering") or [])
