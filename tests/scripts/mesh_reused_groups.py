"""Groups torch reuses for a DeviceMesh, each used a known number of times: with 2 ranks,
init_device_mesh("cpu", (1, 2), mesh_dim_names=("dp_shard", "tp")) makes tp the world's default
group (its group_desc is default_pg) and dp_shard a group of one rank on each rank; beside them,
new_group(group_desc="my_data_parallel") over both ranks. Writes the calls per group a step to
argv[1] on rank 0.

    trace-run --nproc-per-node 2 --out DIR tests/scripts/mesh_reused_groups.py EXPECTED.json
"""
import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

import tracer

CALLS = {"tp": 3, "dp_shard": 2, "my_data_parallel": 1}       # all-reduces a step, per group
STEPS = 3


def main() -> None:
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (1, 2), mesh_dim_names=("dp_shard", "tp"))
    tp, dp_shard = mesh["tp"].get_group(), mesh["dp_shard"].get_group()
    mine = dist.new_group([0, 1], group_desc="my_data_parallel")
    x = torch.ones(16)
    for _ in range(STEPS):
        for group, n in ((tp, CALLS["tp"]), (dp_shard, CALLS["dp_shard"]),
                         (mine, CALLS["my_data_parallel"])):
            for _ in range(n):
                dist.all_reduce(x, group=group)
        x = x / 2
        tracer.step()
    if dist.get_rank() == 0:
        with open(sys.argv[1], "w") as fh:
            json.dump({"calls": CALLS, "steps": STEPS,
                       "tp": dist.get_process_group_ranks(tp),
                       "tp_is_the_default_group": tp is dist.group.WORLD,
                       "dp_shard": dist.get_process_group_ranks(dp_shard)}, fh)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
