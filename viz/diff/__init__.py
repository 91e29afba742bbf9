"""``trace-diff``: what changed between two runs (another parallel layout, schedule or code edit).

:func:`compare_runs` takes both runs analysed once (:mod:`viz.analysis`; :func:`diff_runs`
analyses them first), matches them by rank role (:mod:`.roles`), profiles every rank
(:mod:`.profile`: ops per module and phase, call-graph functions, communication per kind, phase
and process group, FLOPs, time metrics), compares matched roles and the totals over all ranks
(:mod:`.result`), builds diff call graphs (:mod:`.graph`) and says the communication changes in
words (:mod:`.words`). Pure: the renderers draw the result (:mod:`viz.render.diff`: the
terminal table, ``diff.json``, ``diff.html`` and the diff call-graph SVGs). See docs/diff.md.

*Structure* is the exact multisets of ops per (module, op, phase), call-graph function nodes and
communication per (kind, phase, process group) of every role, and the set of roles: runs without a
difference there have "no structural change". FLOPs and bytes follow from recorded shapes and
are compared exactly too, but reported as sizes; time is always reported with both values and a
relative change, never as structure.
"""
from __future__ import annotations

from typing import Optional

from ..analysis import RunAnalysis, analyse, recount
from ..analysis.grid import grid_of
from ..analysis.source import display_paths
from ..engine import Engine
from ..run import Run
from .graph import build_diff_graph
from .profile import merge, rank_profile
from .result import ALL_RANKS, DiffResult, RunSide, ScopeDiff, compare
from .roles import assign_roles, group_label, match_roles
from .words import describe

MAX_GRAPHS = 8        # diff call graphs drawn: all ranks, then roles that changed first
__all__ = ["compare_runs", "diff_runs", "DiffResult", "ScopeDiff"]

def _profiles(analysis: RunAnalysis, grid: Optional[tuple]) -> tuple:
    """(rank -> Profile, display paths) of every readable rank, process groups named along
    ``grid``."""
    groups = {rank: mine.op_groups for rank, mine in analysis.ranks.items()}
    paths = display_paths({f.file for gs in groups.values() for g in gs for f in g.path})
    out = {rank: rank_profile(rank, mine.op_groups, mine.comm, paths, analysis.metrics.get(rank),
                              mine.steps, lambda ranks: group_label(ranks, grid),
                              analysis.dimensions.get(rank, ()))
           for rank, mine in sorted(analysis.ranks.items())}
    return out, paths


def _side(analysis: RunAnalysis, steps: frozenset) -> RunSide:
    return RunSide(analysis.run.dir, analysis.world_size, tuple(sorted(analysis.ranks)),
                   dict(analysis.config), tuple(sorted(steps)))


def diff_runs(run_a: Run, run_b: Run, *, engine: Optional[Engine] = None) -> DiffResult:
    """Compare run ``b`` against the baseline ``a`` (both opened with viz.run.open_run),
    analysed on ``engine`` (default: this process)."""
    return compare_runs(analyse(run_a, engine), analyse(run_b, engine), engine=engine)


def compare_runs(a: RunAnalysis, b: RunAnalysis, *, engine: Optional[Engine] = None
                 ) -> DiffResult:
    """Compare the analysed run ``b`` against the baseline ``a``; ranks are recounted on
    ``engine`` when the runs recorded different steps."""
    steps_a, steps_b = a.recorded_steps, b.recorded_steps
    # Counts are only comparable over the same iterations (trace-run --steps 1- leaves out the
    # setup of step 0, a longer run has more steps): compare the steps both recorded.
    common = steps_a & steps_b if steps_a != steps_b and steps_a & steps_b else None
    if common:
        a, b = recount(a, common, engine), recount(b, common, engine)
    roles_a, roles_b, method = assign_roles(a.config, a.world_size, a.ranks, b.config,
                                            b.world_size, b.ranks)
    # Groups are named by grid axes only when both runs have a grid, as roles are.
    grids = (grid_of(a.config, a.world_size), grid_of(b.config, b.world_size))
    if not all(grids):
        grids = (None, None)
    prof_a, paths_a = _profiles(a, grids[0])
    prof_b, paths_b = _profiles(b, grids[1])
    matched, only_a, only_b = match_roles(roles_a, roles_b)
    roles = [compare(role.label, prof_a[ra], prof_b[rb]) for role, ra, rb in matched]
    totals = compare(ALL_RANKS, merge(list(prof_a.values())), merge(list(prof_b.values())))

    def merged(analysis):
        return [g for r in sorted(analysis.ranks) for g in analysis.ranks[r].op_groups]

    graphs = [build_diff_graph(ALL_RANKS, merged(a), paths_a, merged(b), paths_b)]
    # Roles whose structure (then sizes) changed are drawn first: with many roles, the first
    # few by rank are often the unchanged ones.
    drawn = sorted(zip(matched, roles), key=lambda m: (not m[1].structural,
                                                       not m[1].sizes_changed))
    for (role, ra, rb), _ in drawn[:MAX_GRAPHS - 1]:
        graphs.append(build_diff_graph(role.label, a.ranks[ra].op_groups, paths_a,
                                       b.ranks[rb].op_groups, paths_b))

    keys = sorted(set(a.config) | set(b.config))
    changes = [(k, a.config.get(k), b.config.get(k)) for k in keys
               if a.config.get(k) != b.config.get(k)]
    return DiffResult(_side(a, steps_a), _side(b, steps_b), method, changes, roles, only_a,
                      only_b, totals, graphs, _warnings(a, b, steps_a, steps_b, common),
                      tuple(sorted(common or steps_a | steps_b)), in_words=describe(totals))


def _warnings(a: RunAnalysis, b: RunAnalysis, steps_a: frozenset, steps_b: frozenset,
              common: Optional[frozenset]) -> list:
    """What makes the comparison partial: unreadable ranks, different recorded steps."""
    out = []
    for name, analysis in (("A", a), ("B", b)):
        missing = analysis.missing()
        if missing:
            runs = ", ".join(str(first) if first == last else f"{first}-{last}"
                             for first, last in missing)      # runs: a world of 10^7 is cheap
            out.append(f"run {name} has no readable trace for ranks {runs}: they are left out")
    if common:
        out.append(f"the runs recorded different steps (A {sorted(steps_a)}, B "
                   f"{sorted(steps_b)}): ops, FLOPs and communication are compared over the "
                   f"steps both recorded, {sorted(common)}")
    elif steps_a != steps_b:
        out.append(f"the runs recorded no step in common (A {sorted(steps_a)}, B "
                   f"{sorted(steps_b)}): counts cover different iterations")
    return out
