"""Process groups named the ways users name them, each used a known number of times: a
torchtitan-style DeviceMesh (dims ``dp_shard`` x ``tp``, its groups ``mesh_dp_shard`` and
``mesh_tp``), a plain ``new_group`` given ``group_desc="cp"``, and one given none. Run with 4
ranks under trace-run; writes the expected calls per group (ranks) as JSON to argv[1] on
rank 0.

    trace-run --nproc-per-node 4 --out DIR tests/scripts/dimension_groups.py EXPECTED.json
"""
import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

import tracer

CALLS = {"tp": 3, "dp_shard": 2, "cp": 1, "unnamed": 4}       # all-reduces a step, per group
STEPS = 3


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp_shard", "tp"))
    tp, dp = mesh["tp"].get_group(), mesh["dp_shard"].get_group()
    # every rank creates every group, in the same order: cp pairs (0,3) and (1,2), plain (0,1,2,3)
    cp = [dist.new_group(ranks, group_desc="cp") for ranks in ([0, 3], [1, 2])]
    mine_cp = cp[0] if rank in (0, 3) else cp[1]
    unnamed = dist.new_group([0, 1, 2, 3])
    x = torch.ones(16)
    for _ in range(STEPS):
        for group, n in ((tp, CALLS["tp"]), (dp, CALLS["dp_shard"]), (mine_cp, CALLS["cp"]),
                         (unnamed, CALLS["unnamed"])):
            for _ in range(n):
                dist.all_reduce(x, group=group)
        x = x / 4
        tracer.step()
    if rank == 0 and len(sys.argv) > 1:
        with open(sys.argv[1], "w") as fh:
            json.dump({"calls": CALLS, "steps": STEPS,
                       "tp": dist.get_process_group_ranks(tp),
                       "dp_shard": dist.get_process_group_ranks(dp)}, fh)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
