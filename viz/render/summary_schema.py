"""summary.json's document: the machine-readable digest of a run (schema
``paratrace.summary/1``) as a dict, from a :class:`viz.analysis.RunAnalysis`; the renderer
:mod:`viz.render.report.summary_json` writes it.

The contract is docs/contract.md's; tests and scripts read it, so keys keep their meaning
and new keys are only added. Every key of the file is spelled here, and only here: the
analyses hand over typed records (RankMetrics, CrossRank, Path, CommRow, DeviceSummary), this
module names their fields for JSON. Per rank: status, event count, op counts (in all and per
phase), communication aggregated by (kind, phase, group), the timeline's time metrics and the
GPU activity. Ranks of the world with no trace file and nothing in run.json are
``missing_ranks``, runs of ``[first, last]``, instead of an entry each. Nothing reads this file
back: the report reads the analysis.
"""
from __future__ import annotations

from typing import Optional

from tracer.vocab.groups import group_ranks, group_text, process_group_name

from ..analysis.crossrank.critical_path import Path
from ..analysis.crossrank.dimensions import OTHER
from ..analysis.crossrank.matching import CrossRank, Mismatch
from ..analysis.device.gpu_attribution import DeviceSummary, DeviceWhole
from ..analysis.memory.live_bytes import RECORDING, MemoryProfile, PeakScope, peak_scope
from ..analysis.rank import LastOp
from ..analysis.run_analysis import RunAnalysis
from ..analysis.timeline.metrics import PipelineBubble, RankMetrics, StepMetrics
from ..views.formatters import site_text
from ..views.problems import mismatch_text, rank_error

SCHEMA = "paratrace.summary/1"
TIME_KEYS = ("wall_s", "compute_s", "comm_s", "exposed_comm_s", "idle_s", "overlap_fraction",
             "bubble_fraction")
MAX_MISMATCHES = 100           # mismatches listed (all are counted)
MAX_PATH_MODULES = 20          # modules of a critical path listed, most time first
MAX_MEMORY_MODULES = 20        # modules of a memory peak listed, most bytes first
NO_MODULE = "(no module)"      # a storage made outside every module, or found by a walk
NO_OP = "(no op)"              # a storage no op made (parameters found by a walk...)


def build_summary(analysis: RunAnalysis) -> dict:
    """The summary dict of an analysed run."""
    ranks = {}
    names = analysis.group_dimensions
    for rank in analysis.listed():
        entry = {"status": analysis.status(rank)}
        mine = analysis.ranks.get(rank)
        if mine is not None:
            metrics = analysis.metrics.get(rank)
            time = time_json(metrics) if metrics else {k: None for k in TIME_KEYS}
            time["clock"] = mine.lanes.clock
            entry.update(events=mine.events, op_counts=mine.op_counts,
                         op_counts_by_phase=mine.op_counts_by_phase,
                         comm=comm_json(mine.comm, names),
                         dimensions=dimensions_json(analysis.dimensions.get(rank, [])),
                         time=time, clock_error_ns=mine.lanes.clock_error_ns, steps=mine.steps)
            if mine.device is not None:
                entry["device"] = device_json(mine.device)
            if mine.memory is not None:
                entry["memory"] = memory_json(mine.memory, peak_scope(mine.meta))
            if mine.warnings:
                entry["warnings"] = mine.warnings
        else:
            entry.update(events=0, op_counts={}, op_counts_by_phase={}, comm=[], dimensions={},
                         time={k: None for k in TIME_KEYS})
        error = rank_error(analysis, rank) if entry["status"] != "ok" else None
        if error:
            entry["error"] = error
        if mine is not None and entry["status"] != "ok" and mine.last_op is not None:
            entry["last_op"] = last_op_json(mine.last_op)
        ranks[str(rank)] = entry
    # the other ranks of the world have no trace file and nothing recorded: runs of them,
    # not an entry each (a world of a million beside 2 traces stays a small file)
    return {"schema": SCHEMA, "world_size": analysis.world_size, "config": analysis.config,
            "command": analysis.run.info.get("command"), "ranks": ranks,
            "missing_ranks": [list(pair) for pair in analysis.unlisted()],
            "process_groups": process_groups_json(names),
            "cross_rank": dict(cross_rank_json(analysis.cross, names),
                               critical_path=[path_json(p) for p in analysis.paths])}


# ---------------------------------------------------------------------------- per rank
def time_json(m: RankMetrics) -> dict:
    """A rank's ``time`` object: docs/contract.md's keys first, then the details (the caller
    adds ``clock``)."""
    return {
        "wall_s": m.wall_s, "compute_s": m.compute_s, "comm_s": m.comm_s,
        "exposed_comm_s": m.exposed_comm_s, "idle_s": m.idle_s,
        "overlap_fraction": m.overlap_fraction, "bubble_fraction": m.bubble_fraction,
        "overlapped_comm_s": m.overlapped_comm_s, "memory_s": m.memory_s,
        "counted_steps": list(m.counted_steps),
        "pipeline": pipeline_json(m.pipeline),
        "theoretical_bubble_fraction": m.theoretical_bubble_fraction,
        "pass_compute_s": m.passes,
        "phase_s": m.phase_s,
        "clock_error_s": m.clock_error_s,
        "per_step": [step_json(s) for s in m.steps],
        **_why_null(m),
    }


def _why_null(m: RankMetrics) -> dict:
    """Why a fraction is null (never NaN): there was nothing to divide by."""
    why = {}
    if m.overlap_fraction is None:
        why["overlap_fraction"] = "no communication in the counted steps"
    if m.bubble_fraction is None:
        why["bubble_fraction"] = "no counted step"
    return {"why_null": why} if why else {}


def step_json(s: StepMetrics) -> dict:
    """One step of ``time.per_step``."""
    return {"step": s.step, "wall_s": s.wall_s, "compute_s": s.compute_s, "comm_s": s.comm_s,
            "overlapped_comm_s": s.overlapped_comm_s, "exposed_comm_s": s.exposed_comm_s,
            "idle_s": s.idle_s, "overlap_fraction": s.overlap_fraction,
            "bubble_fraction": s.bubble_fraction, "pipeline": pipeline_json(s.pipeline),
            "memory_s": s.memory_s, "phase_s": s.phase_s, "start_ns": s.start,
            "end_ns": s.end}


def pipeline_json(p: Optional[PipelineBubble]) -> Optional[dict]:
    """``time.pipeline`` (and each step's): the pipeline bubble and its parts."""
    if p is None:
        return None
    return {"window_s": p.window_s, "bubble_s": p.bubble_s, "bubble_fraction": p.bubble_fraction,
            "warmup_fraction": p.warmup_fraction, "steady_fraction": p.steady_fraction,
            "cooldown_fraction": p.cooldown_fraction,
            "simulated_bubble_fraction": p.simulated_bubble_fraction,
            "theoretical_bubble_fraction": p.theoretical_bubble_fraction}


def comm_json(rows: list, names: dict) -> list:
    """A rank's ``comm`` rows (viz.analysis.rank.CommRow), each with its group's dimension."""
    return [{"kind": r.kind, "phase": r.phase, "group": list(r.group),
             "process_group": r.process_group,
             "dimension": _dimension(names, group_text(r.group, name=r.process_group)),
             "count": r.count, "bytes": r.bytes}
            for r in rows]


def _dimension(names: Optional[dict], text: str) -> str:
    found = (names or {}).get(text)
    return found.dimension if found is not None else OTHER


def memory_json(m: MemoryProfile, scope: PeakScope = PeakScope(RECORDING)) -> dict:
    """A rank's ``memory`` (viz.analysis.memory.live_bytes.MemoryProfile; present only where memory
    was recorded): the peak, what it covers (the recording, or memory made within an export, with
    the export's own total-allocated peak), when, what was live at it by category, module and
    phase, its top source sites, each category's own peak and each step's peak."""
    return {"peak_bytes": m.peak_bytes, "scope": scope.scope,
            "allocated_peak_bytes": scope.allocated_peak,
            "peak_step": m.peak_step, "peak_ns": m.peak_time,
            "by_category": m.at_peak["category"],
            "by_module": _named(m.at_peak["module"], NO_MODULE, MAX_MEMORY_MODULES),
            "by_phase": _named(m.at_peak["phase"], NO_OP, None),
            "top_sites": [{"site": site, "bytes": b} for site, b in m.at_peak["site"]],
            "category_peaks": m.category_peaks,
            "step_peaks": {str(s): b for s, b in sorted(m.step_peaks.items())},
            "storages": m.storages}


def _named(values: dict, none: str, most: Optional[int]) -> dict:
    """``values`` (largest first) with their None key named, the first ``most`` kept."""
    items = list(values.items())[:most]
    return {none if k is None else k: v for k, v in items}


def dimensions_json(costs: list) -> dict:
    """A rank's ``dimensions``: per parallel dimension
    (viz.analysis.crossrank.dimensions.DimensionCost, most exposed first), its communication over
    the counted steps."""
    return {c.dimension: {"count": c.count, "bytes": c.bytes, "comm_s": c.comm_s,
                          "overlapped_s": c.overlapped_s, "exposed_s": c.exposed_s,
                          "names": list(c.names)}
            for c in costs}


def process_groups_json(names: dict) -> list:
    """``process_groups``: every recorded group with its dimension, where that was read and
    the user's own names of it."""
    return [{"group": list(group_ranks(text)), "process_group": process_group_name(text),
             "desc": g.desc, "dimension": g.dimension, "from": g.source,
             "names": list(g.names)}
            for text, g in sorted(names.items(), key=lambda kv: (group_ranks(kv[0]), kv[0]))]


def last_op_json(last: LastOp) -> dict:
    """A failed rank's ``last_op``: its last op, where, its last collective."""
    out: dict = {}
    if last.op is not None:
        out["op"] = last.op
    if last.where is not None:
        out["where"] = f"{last.where[0]}:{last.where[1]}"
    if last.collective is not None:
        c = last.collective
        out["collective"] = {"kind": c.kind, "group": c.group, "seq": c.seq,
                             "completed": c.completed}
    return out


def device_json(d: DeviceSummary) -> dict:
    """A rank's ``device`` object."""
    return {"activities": d.activities, "attributed": d.attributed,
            "attributed_by": {"inside_an_event": d.inside_an_event,
                              "inside_a_region": d.inside_a_region,
                              "process_group_setup": d.process_group_setup,
                              "between_events": d.between_events},
            "busy_s": d.busy_s, "by_op": d.by_op, "whole": whole_json(d.whole)}


def whole_json(w: DeviceWhole) -> dict:
    """``device.whole``: every activity of the recording or export (docs/contract.md)."""
    out = {"kernels": w.kernels, "memcpys": w.memcpys, "memsets": w.memsets,
           "comm_kernels": w.comm_kernels, "span_s": w.span_s, "busy_s": w.busy_s,
           "compute_s": w.compute_s, "comm_s": w.comm_s, "memory_s": w.memory_s,
           "idle_s": w.idle_s, "overlap_fraction": w.overlap_fraction}
    if w.overlap_fraction is None:
        out["why_null"] = {"overlap_fraction": "no NCCL kernel: no device communication"}
    return out


# ---------------------------------------------------------------------------- across ranks
def cross_rank_json(cross: CrossRank, names: dict) -> dict:
    """``cross_rank`` (less its ``critical_path``)."""
    return {
        "matched": len(cross.matched), "unmatched": cross.unmatched,
        "unmatched_p2p": cross.unmatched_p2p,
        "mismatch_count": len(cross.mismatches),
        "mismatches": [mismatch_json(m) for m in cross.mismatches[:MAX_MISMATCHES]],
        "stragglers": [{"rank": r, "late_s": s} for r, s in cross.stragglers()],
        "wait_s": {str(r): ns / 1e9 for r, ns in sorted(cross.wait_ns.items())},
        "collectives": collectives_json(cross, names),
    }


def mismatch_json(m: Mismatch) -> dict:
    """One of ``cross_rank.mismatches``."""
    return {"group": list(group_ranks(m.group)), "process_group": process_group_name(m.group),
            "seq": m.seq, "what": m.what,
            "sides": [{"value": value, "ranks": list(ranks),
                       "sites": sorted({site_text(s) for s in sites if s is not None})}
                      for value, ranks, sites in m.sides],
            "text": mismatch_text(m)}


def collectives_json(cross: CrossRank, names: Optional[dict] = None) -> list:
    """``cross_rank.collectives``: per (kind, group), counts, bytes and bandwidths."""
    return [{"kind": c.kind, "group": list(group_ranks(c.group)),
             "process_group": process_group_name(c.group),
             "dimension": _dimension(names, c.group), "count": c.count,
             "bytes": c.bytes, "median_s": c.median_s, "algbw_GBps": c.algbw_GBps,
             "busbw_GBps": c.busbw_GBps, "site": site_text(c.site)}
            for c in cross.collectives()]


def path_json(p: Path) -> dict:
    """One step's ``cross_rank.critical_path``."""
    total = p.ns or 1
    return {"step": p.step, "end_rank": p.end_rank, "length_s": p.ns / 1e9,
            "rank_share": {str(r): ns / total for r, ns in p.by_rank().items()},
            "kind_share": {k: ns / total for k, ns in p.by_what().items()},
            "module_share": {m: ns / total for m, ns in sorted(
                p.modules.items(), key=lambda kv: -kv[1])[:MAX_PATH_MODULES]},
            "segments": len(p.segments)}
