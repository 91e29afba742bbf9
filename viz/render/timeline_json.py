"""Chrome trace JSON of a timeline: opens in Perfetto (ui.perfetto.dev) and chrome://tracing.

Ranks are processes; each process has a "passes & annotations" thread (F/B/W passes and the
other annotation ranges, nested), one thread per recording thread with its aten ops (each with
its ``args``: module, phase, source line and function, input shapes, step), as many "comm"
threads as it takes to lay out overlapping communications without overlap, and, where memory
was recorded, a "memory" counter track (live bytes by category). Every pipeline send is joined
to the recv that consumed it by a flow arrow, and every collective matched across ranks
(viz.analysis.crossrank.matching) by one flow through its members' slices, lowest rank to highest,
each at the member's completion. Times are microseconds from the first event of the run, on rank
0's clock. Only draws what viz.analysis computed.
"""
from __future__ import annotations

import bisect
import io
import json

from typing import Sequence

import numpy as np

from ..analysis.timeline.lanes import Timeline

_PASS_TID = 0
_OPS_TID = 1          # + recording thread number
_COMM_TID = 1000      # + comm lane
_GPU_TID = 2000       # + CUDA stream
_CHUNK = 10_000       # events made into text at a time: a rank's never sit in memory whole


def _lane_of(spans: list) -> list:
    """Greedy interval partitioning: a lane index per span (spans sorted by start), so that spans
    in one lane never overlap (Chrome's complete events on one thread must nest)."""
    lane_end: list = []
    lanes = []
    for span in spans:
        for i, end in enumerate(lane_end):
            if end <= span.start:
                lane_end[i] = span.end
                lanes.append(i)
                break
        else:
            lane_end.append(span.end)
            lanes.append(len(lane_end) - 1)
    return lanes


def render(timeline: Timeline, matched: Sequence = ()) -> str:
    """The Chrome trace JSON text; ``matched``: the collectives matched across ranks
    (viz.analysis.crossrank.matching.CrossRank.matched), each drawn as a flow."""
    out = io.StringIO()
    write(timeline, out, matched)
    return out.getvalue()


class _Events:
    """The traceEvents array, written as it is made: a run's events never sit in memory whole
    (64 ranks make hundreds of MB of JSON)."""

    def __init__(self, fh):
        self.fh, self.first = fh, True

    def text(self, chunk: str) -> None:
        """Comma-separated event objects, already JSON."""
        if chunk:
            self.fh.write(chunk if self.first else "," + chunk)
            self.first = False

    def dicts(self, events: list) -> None:
        self.text(",".join(json.dumps(e, separators=(",", ":")) for e in events))


def write(timeline: Timeline, fh, matched: Sequence = ()) -> None:
    """Write the Chrome trace JSON to ``fh``, rank by rank: a run can have hundreds of
    thousands of op slices (viz.analysis.timeline.rank_lanes.DRAWN_OPS caps how many); ``matched``:
    the collectives matched across ranks, each a flow."""
    firsts = [int(lane.op_start.min()) for lane in timeline.ranks.values() if len(lane.op_start)]
    firsts += [c.start for lane in timeline.ranks.values() for c in lane.comm[:1]]
    firsts += [p.start for lane in timeline.ranks.values() for p in lane.passes[:1]]
    firsts += [int(lane.live_memory.times[0]) for lane in timeline.ranks.values()
               if lane.live_memory is not None and len(lane.live_memory.times)]
    base = min(firsts, default=0)

    def us(t: int) -> float:
        return (t - base) / 1e3

    links = _Links(timeline)
    collectives = _collective_flows(matched, len(timeline.links))
    fh.write('{"traceEvents":[')
    events = _Events(fh)
    for rank, lane in sorted(timeline.ranks.items()):
        where: dict = {}     # this rank's comm rows -> (tid, start, end) of their slices
        events.dicts(_process(rank, lane, us, where))
        events.dicts(links.flows(rank, where, us))
        events.dicts(_members(collectives.get(rank, ()), rank, where, us))
        events.dicts(_memory(rank, lane, us))
        names = [json.dumps(n) for n in lane.op_names]
        args = lane.op_arg_texts or ["{}"]
        codes = lane.op_args if len(lane.op_args) == len(lane.op_start) else \
            np.zeros(len(lane.op_start), dtype=np.int32)
        for a in range(0, len(lane.op_start), _CHUNK):
            b = a + _CHUNK
            events.text(",".join(
                f'{{"ph":"X","name":{names[code]},"cat":"compute","pid":{rank},'
                f'"tid":{_OPS_TID + thread},"ts":{(start - base) / 1e3:.3f},'
                f'"dur":{(end - start) / 1e3:.3f},"args":{args[arg]}}}'
                for start, end, code, thread, arg in zip(
                    lane.op_start[a:b].tolist(), lane.op_end[a:b].tolist(),
                    lane.op_name[a:b].tolist(), lane.op_thread[a:b].tolist(),
                    codes[a:b].tolist())))
    flow_id = len(timeline.links) + len(matched)
    for rank, lane in sorted(timeline.ranks.items()):
        if lane.device is not None:
            flow_id = _gpu(rank, lane, us, events, base, flow_id)
    hidden = {str(r): lane.hidden_ops for r, lane in timeline.ranks.items() if lane.hidden_ops}
    other = {"generator": "paratrace", "config": timeline.config, "ops_not_drawn": hidden,
             "clock": {str(r): lane.clock for r, lane in timeline.ranks.items()},
             "gpu_activities_not_drawn": {str(r): lane.device.hidden
                                          for r, lane in timeline.ranks.items()
                                          if lane.device is not None and lane.device.hidden}}
    fh.write(f'],"displayTimeUnit":"ms","otherData":{json.dumps(other, separators=(",", ":"))}}}')


class _Links:
    """The P2P links' columns, so each rank's flow ends are written with that rank's slices:
    a dict of every rank's slices (hundreds of thousands on 64 ranks) is never held. Link n is
    flow n; a flow is drawn when both its send and its recv have a slice."""

    def __init__(self, timeline: Timeline):
        n, links = len(timeline.links), timeline.links
        self.src, self.src_index, self.dst, self.dst_index = (
            links.column(name) for name in ("src", "src_index", "dst", "dst_index"))
        src_ok, dst_ok = np.zeros(n, bool), np.zeros(n, bool)
        for rank, lane in timeline.ranks.items():
            rows = lane.comm.column("index")
            for ok, ranks, index in ((src_ok, self.src, self.src_index),
                                     (dst_ok, self.dst, self.dst_index)):
                mine = ranks == rank
                ok[mine] = np.isin(index[mine], rows)
        self.drawn = src_ok & dst_ok

    def flows(self, rank: int, where: dict, us) -> list:
        """The flow ends on ``rank``: the arrow leaves a send where it was posted and lands
        where the recv completed. ``where``: the rank's comm rows -> (tid, start, end)."""
        out = []
        for n in np.nonzero(self.drawn & (self.src == rank))[0].tolist():
            tid, start, _ = where[int(self.src_index[n])]
            out.append({"ph": "s", "id": n, "name": "p2p", "cat": "p2p", "pid": rank,
                        "tid": tid, "ts": us(start)})
        for n in np.nonzero(self.drawn & (self.dst == rank))[0].tolist():
            tid, start, end = where[int(self.dst_index[n])]
            out.append({"ph": "f", "bp": "e", "id": n, "name": "p2p", "cat": "p2p",
                        "pid": rank, "tid": tid, "ts": us(max(start, end - 1))})
        return out


def _collective_flows(matched: Sequence, first_id: int) -> dict:
    """rank -> [(flow id, "s" | "t" | "f", its comm row)]: each matched collective of two
    members or more is one flow, from its lowest rank through the others to its highest."""
    out: dict = {}
    for n, m in enumerate(matched):
        members = sorted(m.spans)
        if len(members) < 2:
            continue
        for i, rank in enumerate(members):
            phase = "s" if i == 0 else "f" if i == len(members) - 1 else "t"
            out.setdefault(rank, []).append((first_id + n, phase, m.spans[rank].index,
                                             f"{m.kind} #{m.seq}"))
    return out


def _members(ends: Sequence, rank: int, where: dict, us) -> list:
    """One rank's ends of the collectives' flows, each on its comm slice at its completion."""
    out = []
    for flow, phase, row, name in ends:
        tid, start, end = where[row]
        event = {"ph": phase, "id": flow, "name": name, "cat": "collective", "pid": rank,
                 "tid": tid, "ts": us(max(start, end - 1))}
        if phase != "s":
            event["bp"] = "e"
        out.append(event)
    return out


def _memory(rank: int, lane, us) -> list:
    """The rank's "memory" counter track: live bytes by category at each corner of the step
    function (viz.analysis.memory.live_bytes.LiveMemory), where memory was recorded."""
    live = lane.live_memory
    if live is None:
        return []
    names = [str(c) for c in live.categories]
    return [{"ph": "C", "name": "memory", "cat": "memory", "pid": rank, "ts": us(t),
             "args": dict(zip(names, row))}
            for t, row in zip(live.times.tolist(), live.live.tolist())]


def _gpu(rank: int, lane, us, events: _Events, base: int, flow_id: int) -> int:
    """GPU tracks of one rank, a thread per CUDA stream, and a flow arrow from each launch to
    its activity when the launching op is drawn. Returns the next flow id."""
    dev = lane.device
    out: list = []
    for stream in sorted(set(dev.stream.tolist())):
        out.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": _GPU_TID + stream,
                    "args": {"name": f"GPU stream {stream}"}})
    events.dicts(out)
    out = []
    names = [json.dumps(n) for n in dev.names]
    memory = dev.memory if dev.memory is not None else np.zeros(len(dev.start), bool)
    # a category per kind of GPU work: communication, memory activity, compute
    cat = np.where(dev.comm, "gpu_comm", np.where(memory, "gpu_memory", "gpu"))
    drawn = sorted(zip(lane.op_start.tolist(), lane.op_end.tolist(), lane.op_thread.tolist()))
    starts = [d[0] for d in drawn]
    for lo in range(0, len(dev.start), _CHUNK):    # in chunks: a rank has 100,000 of them
        hi = lo + _CHUNK
        events.text(",".join(
            f'{{"ph":"X","name":{names[code]},"cat":"{c}","pid":{rank},'
            f'"tid":{_GPU_TID + stream},"ts":{(a - base) / 1e3:.3f},"dur":{(b - a) / 1e3:.3f}}}'
            for a, b, stream, code, c in zip(dev.start[lo:hi].tolist(), dev.end[lo:hi].tolist(),
                                             dev.stream[lo:hi].tolist(),
                                             dev.name[lo:hi].tolist(), cat[lo:hi].tolist())))
        out = []
        for a, launch, thread, stream in zip(dev.start[lo:hi].tolist(),
                                             dev.launch[lo:hi].tolist(),
                                             dev.thread[lo:hi].tolist(),
                                             dev.stream[lo:hi].tolist()):
            i = bisect.bisect_right(starts, launch) - 1
            if launch < 0 or i < 0 or drawn[i][1] < launch or drawn[i][2] != thread:
                continue
            out.append({"ph": "s", "id": flow_id, "name": "launch", "cat": "launch",
                        "pid": rank, "tid": _OPS_TID + thread, "ts": us(launch)})
            out.append({"ph": "f", "bp": "e", "id": flow_id, "name": "launch", "cat": "launch",
                        "pid": rank, "tid": _GPU_TID + stream, "ts": us(a)})
            flow_id += 1
        events.dicts(out)
    return flow_id


def _process(rank: int, lane, us, where: dict) -> list:
    """The events of one rank but its op slices: names, passes, annotations, comm, steps."""
    out = [{"ph": "M", "name": "process_name", "pid": rank, "args": {"name": f"rank {rank}"}},
           {"ph": "M", "name": "process_sort_index", "pid": rank, "args": {"sort_index": rank}},
           {"ph": "M", "name": "thread_name", "pid": rank, "tid": _PASS_TID,
            "args": {"name": "passes & annotations"}}]
    for p in lane.passes:
        name = f"{p.kind}{'' if p.microbatch is None else p.microbatch}" + \
            (f".{p.chunk}" if p.chunk else "")
        out.append({"ph": "X", "name": name, "cat": "pass", "pid": rank, "tid": _PASS_TID,
                    "ts": us(p.start), "dur": (p.end - p.start) / 1e3,
                    "args": {"microbatch": p.microbatch, "chunk": p.chunk, "step": p.step,
                             "source": p.source}})
    for start, end, label, _depth in lane.annotations:
        out.append({"ph": "X", "name": label, "cat": "annotation", "pid": rank,
                    "tid": _PASS_TID, "ts": us(start), "dur": (end - start) / 1e3})
    for thread in sorted(set(lane.op_thread.tolist())):
        out.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": _OPS_TID + thread,
                    "args": {"name": f"aten ops (thread {thread})"}})
    lanes = _lane_of(lane.comm)
    for i in sorted(set(lanes)):
        out.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": _COMM_TID + i,
                    "args": {"name": f"comm {i}"}})
    for c, i in zip(lane.comm, lanes):
        tid = _COMM_TID + i
        where[c.index] = (tid, c.start, c.end)
        host_only = c.on_gpu is False      # a device-clock rank's collective with no GPU work
        out.append({"ph": "X", "name": c.kind + (" (no GPU work)" if host_only else ""),
                    "cat": "comm_host" if host_only else "comm", "pid": rank, "tid": tid,
                    "ts": us(c.start), "dur": (c.end - c.start) / 1e3,
                    "args": {"group": c.group, "peer": c.peer, "bytes": c.nbytes,
                             "step": c.step, "completed": c.completed,
                             "end_from_matched_recv": c.capped, "on_gpu": c.on_gpu}})
    for step, (start, _end) in sorted(lane.steps.items()):
        out.append({"ph": "i", "s": "p", "name": f"step {step}", "cat": "step", "pid": rank,
                    "tid": _PASS_TID, "ts": us(start)})
    return out
