"""What --dump writes: losses, step-1 gradients gathered to the full single-process tensors, and
the elements of parameters, gradients and optimizer state each rank holds (what ZeRO shards)."""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from sample_runs.parallel.process_groups import ParallelGroups


def reporting_global_rank(groups: ParallelGroups) -> int:
    """Global rank of (pp = p-1, dp = cp = 0, tp = 0): global = tp + t*(cp + c*(dp + d*pp))."""
    return groups.tp.size * groups.dp_cp.size * (groups.pp.size - 1)


def gather_full_grads(params: list[nn.Parameter], groups: ParallelGroups,
                      grad_of: Callable[[nn.Parameter], torch.Tensor]) -> Optional[dict]:
    """Every parameter's gradient as the full single-process tensor, on the reporting rank.

    Dense parameters come from DP x CP rank 0, one shard per TP rank; expert weights from
    expert-DP rank 0 and TP rank 0, one shard per EP rank. Collective: every rank calls it."""
    local = {}
    for param in params:
        info = param.shard_info
        if info.expert_parallel:
            if groups.expert_dp.rank != 0 or groups.tp.rank != 0:
                continue
            index = groups.ep.rank
        elif groups.dp_cp.rank == 0:
            index = groups.tp.rank
        else:
            continue
        local.setdefault(info.name, (info, index, grad_of(param).detach().cpu()))
    if groups.world_size == 1:
        gathered = [local]
    else:
        dst = reporting_global_rank(groups)
        gathered = [None] * groups.world_size if groups.world_rank == dst else None
        dist.gather_object(local, gathered, dst=dst)
        if gathered is None:
            return None
    shards, infos = defaultdict(dict), {}
    for params_of_rank in gathered:
        for name, (info, index, grad) in params_of_rank.items():
            shards[name][index], infos[name] = grad, info
    return {name: infos[name].unshard([s[i] for i in sorted(s)]).numpy()
            for name, s in sorted(shards.items())}


def held_elements(params: list[nn.Parameter], optimizer: torch.optim.Optimizer) -> dict:
    """Elements this rank holds now: model parameters (storage actually allocated: ZeRO-3 frees
    it outside forward and backward), their gradients, the optimizer's parameters when they are
    separate shards (ZeRO), the shards' gradients, the optimizer state and, apart, the
    optimizer's step counters (a one-element tensor per parameter it updates)."""
    model_ids = {id(p) for p in params}
    storages = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() // p.element_size()
                for p in params}
    opt_params = [p for g in optimizer.param_groups for p in g["params"]
                  if id(p) not in model_ids]
    state = sum(t.numel() for s in optimizer.state.values() for k, t in s.items()
                if k != "step" and isinstance(t, torch.Tensor))
    steps = sum(s["step"].numel() for s in optimizer.state.values()
                if isinstance(s.get("step"), torch.Tensor))
    return {"model_params": sum(n for ptr, n in storages.items() if ptr),
            "model_grads": sum(p.grad.numel() for p in params if p.grad is not None),
            "param_shards": sum(p.numel() for p in opt_params),
            "grad_shards": sum(p.grad.numel() for p in opt_params if p.grad is not None),
            "optimizer_state": state, "optimizer_steps": steps}


def write_dump(path: str, config: dict, losses: list[float], grads: Optional[dict],
               memory: Optional[dict]) -> None:
    """FILE: JSON {"config", "losses", "grads", "memory"}; grads (if any) in FILE.grads.npz,
    keyed by the full parameter names of the single-process model."""
    out = {"config": config, "losses": losses, "grads": None, "memory": memory}
    if grads is not None:
        out["grads"] = str(Path(path).with_suffix(".grads.npz"))
        np.savez(out["grads"], **grads)
    Path(path).write_text(json.dumps(out, indent=1))
