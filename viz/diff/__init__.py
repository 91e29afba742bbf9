"""``trace-diff``: what changed between two runs (another parallel layout, schedule or code edit).

:func:`compare_runs` takes both runs analysed once (:mod:`viz.analysis`; :func:`diff_runs`
analyses them first), matches them by rank role (:mod:`.roles`), profiles every rank
(:mod:`.profile`: ops per module and phase, call-graph functions, communication per kind, phase
and process group, FLOPs, time metrics), compares matched roles and the totals over all ranks
(:mod:`.result`), builds diff call graphs (:mod:`.diffgraph`) and says the communication changes in
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

from tracer.vocab.model_paths import wrappers_seen

from ..analysis import RunAnalysis, analyse, recount
from ..analysis.callgraphs.source_files import display_paths
from ..analysis.crossrank.dimensions import dimension_costs
from ..analysis.memory.live_bytes import peak_in
from ..analysis.timeline.grid import grid_of
from ..analysis.timeline.metrics import over_steps
from ..engine import Engine
from ..run import Run
from .diffgraph import build_diff_graph
from .files import match_files
from .profile import Memory, merge, rank_profile
from .result import ALL_RANKS, DiffResult, RunSide, ScopeDiff, compare
from .roles import assign_roles, group_label, match_roles
from .words import describe

MAX_GRAPHS = 8        # diff call graphs drawn: all ranks, then roles that changed first
__all__ = ["compare_runs", "diff_runs", "DiffResult", "ScopeDiff"]

def _step_range(a: RunAnalysis, b: RunAnalysis) -> tuple:
    """(the steps every figure of the diff covers, or None for each run's own, and a warning
    or None). The steps both runs count (docs/metrics.md: complete steps, step 0's setup left
    out): ops, FLOPs, communication, dimensions, time and memory over the same iterations.
    Without any in common, the steps both recorded, else everything (counts of different
    iterations, said so)."""
    counted_a, counted_b = _counted(a), _counted(b)
    if counted_a & counted_b:
        if counted_a == counted_b:
            return counted_a, None
        return counted_a & counted_b, (
            f"the runs count different steps (A {_steps(counted_a)}, B {_steps(counted_b)}): "
            f"everything is compared over the steps both count, {_steps(counted_a & counted_b)}")
    recorded_a, recorded_b = a.recorded_steps, b.recorded_steps
    if recorded_a & recorded_b:
        return recorded_a & recorded_b, (
            f"the runs count no step in common (A {_steps(counted_a)}, B {_steps(counted_b)}): "
            f"everything is compared over the steps both recorded, "
            f"{_steps(recorded_a & recorded_b)}, setup included")
    return None, (f"the runs recorded no step in common (A {_steps(recorded_a)}, B "
                  f"{_steps(recorded_b)}): counts cover different iterations, times each "
                  "run's counted steps")


def _counted(analysis: RunAnalysis) -> frozenset:
    return frozenset(s for m in analysis.metrics.values() for s in m.counted_steps)


def _steps(steps) -> str:
    return str(sorted(steps))


def _paths(analysis: RunAnalysis) -> dict:
    return display_paths({f.file for mine in analysis.ranks.values()
                          for g in mine.op_groups for f in g.path})


def _profiles(analysis: RunAnalysis, grid: Optional[tuple], paths: dict,
              steps: Optional[frozenset]) -> dict:
    """rank -> Profile of every readable rank over ``steps`` (None: its own counted steps),
    process groups named along ``grid``."""
    dims = analysis.dimensions if steps is None else \
        dimension_costs(analysis.timeline, analysis.group_dimensions, steps)
    out = {}
    for rank, mine in sorted(analysis.ranks.items()):
        metrics = analysis.metrics.get(rank)
        if metrics is not None and steps is not None:
            metrics = over_steps(metrics, steps)
        memory = None
        if mine.memory is not None:
            peak, by_category = peak_in(mine.memory, steps if steps is not None
                                        else frozenset(mine.counted_steps))
            memory = Memory(rank, peak, by_category)
        out[rank] = rank_profile(rank, mine.op_groups, mine.comm, paths, metrics, mine.steps,
                                 lambda ranks: group_label(ranks, grid), dims.get(rank, ()),
                                 memory)
    return out


def _side(analysis: RunAnalysis, steps: frozenset) -> RunSide:
    modules = {g.module for mine in analysis.ranks.values() for g in mine.op_groups}
    return RunSide(analysis.run.dir, analysis.world_size, tuple(sorted(analysis.ranks)),
                   dict(analysis.config), tuple(sorted(steps)), wrappers_seen(sorted(
                       m for m in modules if m)))


def diff_runs(run_a: Run, run_b: Run, *, engine: Optional[Engine] = None) -> DiffResult:
    """Compare run ``b`` against the baseline ``a`` (both opened with viz.run.open_run),
    analysed on ``engine`` (default: this process)."""
    return compare_runs(analyse(run_a, engine), analyse(run_b, engine), engine=engine)


def compare_runs(a: RunAnalysis, b: RunAnalysis, *, engine: Optional[Engine] = None
                 ) -> DiffResult:
    """Compare the analysed run ``b`` against the baseline ``a``, over one range of steps
    (:func:`_step_range`; ranks are recounted over it on ``engine``)."""
    steps_a, steps_b = a.recorded_steps, b.recorded_steps
    steps, warning = _step_range(a, b)
    if steps is not None:
        a = recount(a, steps, engine) if steps != steps_a else a
        b = recount(b, steps, engine) if steps != steps_b else b
    roles_a, roles_b, method = assign_roles(a.config, a.world_size, a.ranks, b.config,
                                            b.world_size, b.ranks)
    # Groups are named by grid axes only when both runs have a grid, as roles are.
    grids = (grid_of(a.config, a.world_size), grid_of(b.config, b.world_size))
    if not all(grids):
        grids = (None, None)

    def merged(analysis):
        return [g for r in sorted(analysis.ranks) for g in analysis.ranks[r].op_groups]

    paths_a = _paths(a)
    paths_b, files = match_files(merged(a), paths_a, merged(b), _paths(b))
    prof_a = _profiles(a, grids[0], paths_a, steps)
    prof_b = _profiles(b, grids[1], paths_b, steps)
    matched, only_a, only_b = match_roles(roles_a, roles_b)
    roles = [compare(role.label, prof_a[ra], prof_b[rb]) for role, ra, rb in matched]
    totals = compare(ALL_RANKS, merge(list(prof_a.values())), merge(list(prof_b.values())))

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
                      only_b, totals, graphs, _warnings(a, b) + ([warning] if warning else []),
                      tuple(sorted(steps)) if steps is not None else (),
                      in_words=describe(totals), matched_files=files)


def _warnings(a: RunAnalysis, b: RunAnalysis) -> list:
    """What makes the comparison partial: unreadable ranks."""
    out = []
    for name, analysis in (("A", a), ("B", b)):
        missing = analysis.missing()
        if missing:
            runs = ", ".join(str(first) if first == last else f"{first}-{last}"
                             for first, last in missing)      # runs: a world of 10^7 is cheap
            out.append(f"run {name} has no readable trace for ranks {runs}: they are left out")
    return out
