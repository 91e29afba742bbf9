"""viz.whatif.reference_gpt.torch_plans against torch.distributed.pipelining's own plans: the
compute
actions each rank runs under ScheduleInterleaved1F1B and ScheduleInterleavedZeroBubble, from
torch's ``_calculate_single_rank_operations`` (the function its schedules build
``pipeline_order`` with), with its no-op padding left out."""
from __future__ import annotations

import pytest

torch_schedules = pytest.importorskip("torch.distributed.pipelining.schedules")

from viz.whatif.reference_gpt.torch_plans import torch_order  # noqa: E402

KIND = {"FORWARD": "F", "FULL_BACKWARD": "B", "BACKWARD_INPUT": "B", "BACKWARD_WEIGHT": "W"}


def torch_plan(cls, pp: int, m: int, v: int, rank: int) -> list:
    """torch's own actions for ``rank`` (no process group needed: the plan is arithmetic)."""
    schedule = object.__new__(cls)
    rounds = max(1, m // pp)
    schedule.n_local_stages, schedule.pp_group_size, schedule._n_microbatches = v, pp, m
    schedule.number_of_rounds, schedule.microbatches_per_round = rounds, m // rounds
    out = []
    for action in schedule._calculate_single_rank_operations(rank):
        if action is not None:
            kind = KIND[action.computation_type.name]
            out.append((kind, action.microbatch_index, action.stage_index // pp))
    return out


@pytest.mark.parametrize("pp,m,v", [(2, 4, 2), (2, 8, 2), (4, 8, 2), (4, 4, 2), (2, 6, 3),
                                    (4, 8, 1), (2, 4, 1)])
@pytest.mark.parametrize("name,cls", [("interleaved", "ScheduleInterleaved1F1B"),
                                      ("zb-h1", "ScheduleInterleavedZeroBubble")])
def test_torch_orders_match_torchs_own_plans(pp, m, v, name, cls):
    for rank in range(pp):
        ours = [tuple(a) for a in torch_order(name, stages=pp, rank=rank, microbatches=m,
                                               chunks=v)]
        assert ours == torch_plan(getattr(torch_schedules, cls), pp, m, v, rank), (rank, name)
