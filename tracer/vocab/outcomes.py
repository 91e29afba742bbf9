"""How a rank's run ended, as trace-run's run.json records it: facts, never sentences
(docs/trace-run.md). instrument writes them (run_record, watchdog, single); viz reads them and
words them, once (viz.views.failures). Torch-free and light: trace-run's watchdog uses it while
the workers run.

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
  ranks it blamed; ``cause``: the rule that blamed this rank (:data:`HANG_RULES`), else what
  the rank was doing (:data:`FINISHED`, :data:`WAITING`), null where torch's agent did not
  report the rank;
- ``interrupted``: Ctrl-C or SIGTERM to trace-run stopped it;
- ``launch``: the launch itself failed; ``cause``: why.
"""
from __future__ import annotations

from typing import Optional

ERROR, ENDED, EXITED, HANG = "error", "ended", "exited", "hang"
INTERRUPTED, LAUNCH = "interrupted", "launch"
KINDS = (ERROR, ENDED, EXITED, HANG, INTERRUPTED, LAUNCH)

# The watchdog's rules (run.json's hang["kind"]; docs/trace-run.md): no rank made progress while
# some waited in a collective; a rank recorded nothing after others finished; a rank closed its
# trace but did not exit. A hang failure's cause for a rank the rule blamed.
COLLECTIVE, LEFT_BEHIND, EXIT = "collective", "left_behind", "exit"
HANG_RULES = (COLLECTIVE, LEFT_BEHIND, EXIT)
# A hang failure's cause for a rank the watchdog did not blame: its trace had closed ok (it was
# exiting), or it was waiting for the ranks blamed.
FINISHED, WAITING = "finished", "waiting"


def failure(kind: str, *, ranks=(), cause: Optional[str] = None, site: Optional[dict] = None,
            step: Optional[int] = None, **more) -> dict:
    """run.json's ``failure`` of a rank; ``more``: the keys of one kind (a hang's
    ``timeout_s``)."""
    return {"kind": kind, "ranks": sorted(ranks), "cause": cause, "site": site, "step": step,
            **more}


def hang_blamed(hang: dict) -> list:
    """The ranks a hang blames: those that never arrived at the collective the others waited
    in, else those left behind or that did not exit."""
    return list(hang.get("never_arrived") or hang.get("lingering") or [])
