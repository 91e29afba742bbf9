"""The timeline of a run: every rank's lanes (:mod:`.rank_lanes`, the map) put together on rank
0's clock (the reduce). :func:`match_p2p` pairs the k-th send from a to b on a group with the
k-th receive on b from a, and says where each send really ended (its matched receive's
completion), before the ranks' lanes are built; :func:`assemble` puts the lanes together into
a :class:`~.lanes.Timeline`. The metrics of a timeline: :mod:`.metrics`; definitions and
worked examples: docs/metrics.md.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .columns import Records
from .grid import grid_of
from .lanes import P2PEnd, P2PLink, RankLanes, Timeline, counted_steps


def match_p2p(endpoints: Mapping[int, Iterable[P2PEnd]]
              ) -> tuple[list[P2PLink], dict[int, dict[int, int]]]:
    """(links, send ends): ``endpoints`` is rank -> :func:`.rank_lanes.p2p_endpoints`. The k-th
    send from a to b on a group pairs with the k-th receive on b from a; a send's data had
    arrived once its receive completed: ``send_ends`` maps rank -> {send row: that completion}."""
    # (group, src, dst) -> (sends, receives)
    queues: dict[tuple[str, int, int], tuple[list[P2PEnd], list[P2PEnd]]] = {}
    for rank in sorted(endpoints):
        for end in endpoints[rank]:
            queues.setdefault((end.group, end.src, end.dst), ([], []))[end.is_recv].append(end)
    links: list[P2PLink] = []
    send_ends: dict[int, dict[int, int]] = {}
    for (_, src, dst), (sends, recvs) in sorted(queues.items()):
        if src not in endpoints or dst not in endpoints:
            continue
        for send, recv in zip(sends, recvs):
            links.append(P2PLink(src, send.index, dst, recv.index))
            send_ends.setdefault(src, {})[send.index] = recv.end
    return links, send_ends


def assemble(lanes: dict[int, RankLanes], links: Iterable[P2PLink], config: dict[str, Any],
             world: int = 0) -> Timeline:
    """The timeline of every rank's lanes. When no rank's passes are named (annotations,
    pipelining labels), passes inferred from each rank's P2P order stand in. When the run
    recorded its rank grid, a rank's pipeline is its grid's (context parallelism's ring and
    expert parallelism are P2P too, but not a pipeline); else the ranks it sent to or received
    from."""
    if not any(lane.passes for lane in lanes.values()):
        for lane in lanes.values():
            lane.passes = lane.inferred_passes
    grid = grid_of(config, world or max(lanes, default=0) + 1)
    if grid is not None:
        for rank, lane in lanes.items():
            lane.pipeline_group = grid.pipeline(rank) if grid.pp > 1 else (rank,)
    counted = [w for lane in lanes.values() for s, w in lane.steps.items()
               if s in counted_steps(lane)]
    origin = min((w[0] for w in counted), default=0)
    return Timeline(dict(sorted(lanes.items())), Records.of(P2PLink, links), config, origin)
