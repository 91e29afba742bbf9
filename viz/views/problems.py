"""What went wrong in a run, worded once for everyone who says it: the terminal
(:func:`problem_lines`: trace-report's and trace-run's lines on stderr; :func:`damage_lines`:
trace-diff's), the report's front page (:func:`problems`), and summary.json's ``error`` of a rank
(:func:`rank_error`). Ranks that disagree about a collective come first (the usual cause of a
hang), then the hang, failed ranks by cause (the first failure, then the ranks that failed
after it), ranks without a readable trace, damaged traces. Facts come
from the :class:`viz.analysis.RunAnalysis` (which ranks are where) and from run.json, whose
facts :mod:`.failures` words (a rank's failure, the hang); this module only words them.
"""
from __future__ import annotations

import os
from typing import Optional

from tracer.files import rundir
from tracer.vocab.groups import group_label
from tracer.vocab.library import LibraryRule
from tracer.vocab.user_frames import trim_dump

from ..analysis.crossrank.matching import Mismatch
from ..analysis.run_analysis import RunAnalysis
from .failures import banner, by_cause, rank_failed, reported_error
from .formatters import rank_list, rank_run_text, site_text

MOST_MISMATCHES = 5           # on the terminal; summary.json lists more
MOST_BANNERS = 20             # mismatch banners on the front page


def mismatch_text(m: Mismatch) -> str:
    """A disagreement in one line: the collective, who issued what from where."""
    head = f"collective #{m.seq} of group [{group_label(m.group)}]"
    if m.what in ("missing", "unknown"):
        (kind, issued, sites), (_, absent, _) = m.sides
        where = _sites_text(sites)
        if m.what == "missing":
            return (f"{head} ({kind}, issued by {rank_list(issued)} at {where}): "
                    f"{rank_list(absent)} never issued it")
        return (f"{head} ({kind}, issued by {rank_list(issued)} at {where}): "
                f"{rank_list(absent)}: the trace ends before it (the rank failed, was killed "
                f"or its trace was cut short); whether it was issued is unknown")
    parts = [f"{rank_list(ranks)}: {value} (at {_sites_text(sites)})"
             for value, ranks, sites in m.sides]
    return f"{head}: ranks disagree on its {m.what}: " + "; ".join(parts)


def _sites_text(sites) -> str:
    return ", ".join(sorted({site_text(s) for s in sites if s is not None})) or "?"


def rank_error(analysis: RunAnalysis, rank: int) -> Optional[str]:
    """Why a rank failed, as recorded by trace-run (run.json's facts, worded by
    :func:`.failures.reported_error`) or the tracer, or why its trace is unreadable."""
    reported = reported_error(analysis.run.info, rank)
    if reported:
        return reported
    if rank in analysis.ranks:
        mine = analysis.ranks[rank]
        if mine.meta.get("error"):
            return mine.meta["error"]
        if mine.status == "running":
            return "the rank ended without closing its trace (killed?)"
    return analysis.unreadable.get(rank)


def world_note(analysis: RunAnalysis) -> Optional[str]:
    """Why the world is not what run.json says, or None
    (:func:`viz.analysis.map_reduce.world_of`)."""
    seen = analysis.world_disagreement
    if seen is None:
        return None
    where = os.path.join(analysis.run.dir, rundir.RUN_RECORD)
    recorded = analysis.world_size
    theirs = f"the traces say {recorded}" if seen.traces_say else \
        f"a trace of rank {seen.highest_rank} is there"
    return f"{where}: world_size {seen.claimed} does not match the traces ({theirs}); " \
        f"the report uses {recorded}"


def rank_damage(analysis: RunAnalysis, rank: int) -> list:
    """One line per thing wrong with ``rank``'s trace: unreadable, absent, or damaged (the file,
    what is wrong, what was kept)."""
    if rank in analysis.unreadable:
        return [f"{analysis.unreadable[rank]}; rank {rank} is left out"]
    if rank not in analysis.ranks:
        return [f"rank {rank}: no trace file in {analysis.run.traces_dir}"]
    return list(analysis.ranks[rank].warnings)


def absent_lines(analysis: RunAnalysis) -> list:
    """What a user is told about the world: the note on its size, then each run of ranks
    without a trace file (or without an export, for an import): ``ranks 2-999: ...``, one line
    for a world of 1,000 ranks beside 2 traces, not 998."""
    where = "no torch.profiler export given (--kineto)" if analysis.imported else \
        f"no trace file in {analysis.run.traces_dir}"
    note = world_note(analysis)
    return ([note] if note else []) + \
        [f"{rank_run_text(first, last)}: {where}" for first, last in analysis.absent()]


def damage_lines(analysis: RunAnalysis) -> list:
    """One line per trace that is missing, unreadable or damaged, then the world's lines."""
    return [line for rank in analysis.with_files() for line in rank_damage(analysis, rank)] \
        + absent_lines(analysis)


def problem_lines(analysis: RunAnalysis, most: int = MOST_MISMATCHES,
                  reported: frozenset = frozenset()) -> list:
    """What a user must see first on the terminal, one line each: ranks that disagree about a
    collective, then damaged or missing traces. A rank that stopped before collectives the
    others issued gets that said once: folded into its damage line if it has one, left out if
    it is in ``reported`` (ranks whose failure the caller already named)."""
    mismatches = [m for m in analysis.cross.mismatches if m.what != "unknown"]
    lines = [f"mismatch: {mismatch_text(m)}" for m in mismatches[:most]]
    if len(mismatches) > most:
        lines.append(f"mismatch: {len(mismatches) - most} more (summary.json cross_rank)")
    cut: dict = {}
    for m in analysis.cross.mismatches:
        if m.what == "unknown":
            for rank in m.sides[1][1]:
                cut.setdefault(rank, []).append(m)
    damage = {rank: rank_damage(analysis, rank) for rank in analysis.with_files()}
    for rank, found in sorted(cut.items()):
        ends = (f"the trace ends before {len(found)} collective(s) the other ranks issued "
                f"(from #{found[0].seq} of group [{group_label(found[0].group)}])")
        if damage.get(rank):
            damage[rank][-1] += f"; {ends}, not compared"
        elif rank not in reported:
            mine = analysis.ranks[rank]
            why = {"failed": "it failed", "interrupted": "it was interrupted"}.get(
                mine.status, f"its recorder says {mine.status}")
            if mine.meta.get("error"):
                why += f" ({mine.meta['error']})"
            lines.append(f"rank {rank}: {ends}: {why}, so they are not compared")
    return lines + [line for rank in sorted(damage) for line in damage[rank]] \
        + absent_lines(analysis)


def problems(analysis: RunAnalysis) -> list:
    """The front page's banners, most important first (``level``, ``title``, ``details``):
    ranks that disagree about a collective, a hang (who never arrived, each rank's state),
    failed ranks (the first failure, then those after it), ranks without a readable trace, the
    world's note, damaged traces, and what a run imported from exports cannot tell."""
    out = [dict(level="mismatch", title=f"Mismatch: {mismatch_text(m)}", details=[])
           for m in analysis.cross.mismatches if m.what != "unknown"][:MOST_BANNERS]
    hang = analysis.run.info.get("hang")
    if hang:
        details = []
        for rank, info in sorted((hang.get("ranks") or {}).items(), key=lambda kv: int(kv[0])):
            details.append(dict(rank=rank, status=info.get("status"), step=info.get("step"),
                                last=info.get("last_collective"),
                                inflight=info.get("inflight"),
                                stack=_user_stack(analysis, rank, info.get("stack"))))
        out.append(dict(level="hang", title=banner(hang), details=details))
    out += failed_banners(analysis)
    for rank in analysis.with_files():
        if analysis.status(rank) == "missing":
            out.append(dict(level="missing", title=f"rank {rank}: no trace "
                            f"({analysis.unreadable[rank]})", details=[]))
    note = world_note(analysis)
    if note:
        out.append(dict(level="warning", title=note, details=[]))
    for first, last in analysis.absent():
        out.append(dict(level="missing", title=f"{rank_run_text(first, last)}: no trace (" + (
            "no torch.profiler export given" if analysis.imported else "no trace file") + ")",
            details=[]))
    for rank, mine in sorted(analysis.ranks.items()):
        for warning in mine.warnings:
            out.append(dict(level="warning", title=f"rank {rank}: {warning}", details=[]))
    notice = not_derivable(analysis)
    if notice:
        out.append(dict(level="notice", title=notice, details=[]))
    return out


def _user_stack(analysis: RunAnalysis, rank, dump: Optional[str]) -> Optional[str]:
    """A rank's Python stacks at the hang (faulthandler's dump) cut to the user's frames and
    the call into the library, by the rank's own library rule (tracer.vocab.user_frames)."""
    mine = analysis.ranks.get(int(rank))
    rule = LibraryRule.from_meta(mine.meta) if mine is not None else None
    return trim_dump(dump, rule) if dump else dump


def failed_banners(analysis: RunAnalysis) -> list:
    """The failed ranks' banners by cause, not by rank number: the first failure (trace-run's
    run.json says which), then the ranks that failed after it (a peer's "Connection closed by
    peer", the launcher ending it), each as a consequence."""
    failed = [r for r in analysis.with_files() if analysis.status(r) == "failed"]
    ended = {r: analysis.ranks[r].meta.get("end_unix") for r in failed if r in analysis.ranks}
    order = by_cause(analysis.run.info, failed, ended)
    out = []
    for i, rank in enumerate(order):
        error = rank_error(analysis, rank)
        if i == 0 and len(order) > 1:
            out.append(dict(level="failed", title=f"rank {rank} failed first: "
                            f"{error or 'no error recorded'}", details=[]))
        elif i == 0:
            out.append(dict(level="failed", title=rank_failed(rank, error), details=[]))
        else:
            out.append(dict(level="followed", title=f"then rank {rank} failed (after rank "
                            f"{order[0]}): {error or 'no error recorded'}", details=[]))
    return out


def not_derivable(analysis: RunAnalysis) -> str:
    """Once, for a run imported from torch.profiler exports: what the exports cannot tell
    (paratrace shows nothing in its place, never a guess), and for which ranks when not all."""
    imported = {r: (m.meta.get("imported") or {}) for r, m in analysis.ranks.items()
                if "imported" in m.meta}
    if not imported:
        return ""
    ranks_of: dict = {}
    for rank, info in sorted(imported.items()):
        for item in info.get("missing") or []:
            ranks_of.setdefault(item, []).append(rank)
    parts = [item if len(ranks) == len(imported) else
             f"{item} (rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))})"
             for item, ranks in ranks_of.items()]
    if any(not any(i.startswith("stacks") for i in info.get("missing") or [])
           for info in imported.values()):
        parts.append("calling lines: a source line is where its function starts (torch."
                     "profiler records no calling line)")
    return ("From torch.profiler exports, not derivable and not shown: " + "; ".join(parts)
            + ".") if parts else ""
