"""Train one of whatif_models' models (llama, gpt2, cnn) under one parallel configuration,
unaware of paratrace, as a user's script is: the configurations trace-whatif predicts
(docs/whatif.md), run for real to compare with (tests/integration/test_whatif_models.py,
benchmarks/whatif_models.py).

  --shard replicate   DDP (torch.nn.parallel.DistributedDataParallel)
  --shard optimizer   ZeRO-1: DDP + torch.distributed.optim.ZeroRedundancyOptimizer
  --shard gradients   ZeRO-2: FSDP2 fully_shard(reshard_after_forward=False) on each unit
  --shard full        FSDP2 fully_shard on each unit and the root (torchtitan's)
  --shard-units P     FSDP2's units (default: the repeated blocks, the items of a ModuleList
                      or ModuleDict); --param-dtype bf16: MixedPrecisionPolicy(param_dtype)
  --checkpoint P      checkpoint_wrapper (non-reentrant) on every module matching P
  --microbatch-size N, --grad-accum N (DDP: no_sync but on the last micro-batch)
  --tp N --tp-plan FILE  tensor parallelism over a (dp, tp) DeviceMesh: parallelize_module
                      with ColwiseParallel / RowwiseParallel for each PATTERN of the JSON plan;
                      the data-parallel wrapper only where dp > 1, over the mesh's dp groups
  --pp N --split P[,P...] --schedule gpipe|1f1b|interleaved --microbatches M
                      torch.distributed.pipelining on N ranks (no data parallelism): the
                      model's top-level sequence (its children in order, a ModuleList's or
                      ModuleDict's items in place of the container) cut before each module P
                      names, each stage the model with what it does not run deleted (its ends
                      set to None), as torchtitan splits its models; stage i on rank i mod N
                      (interleaved: several a rank); M micro-batches of --microbatch-size a step
AdamW, zero_grad(set_to_none=True) after each step.
Usage: trace-run --nproc-per-node 2 whatif_train.py --model llama --shard full [...]"""
import argparse
import contextlib
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from whatif_models import MODELS, batch, build, loss_of  # noqa: E402


def matches(pattern: str, path: str) -> bool:
    """``*`` one segment, ``**`` any number (as trace-whatif's PATTERNs)."""
    import fnmatch

    def go(pat, parts):
        if not pat:
            return not parts
        if pat[0] == "**":
            return any(go(pat[1:], parts[i:]) for i in range(len(parts) + 1))
        return bool(parts) and fnmatch.fnmatchcase(parts[0], pat[0]) and go(pat[1:], parts[1:])
    return go(pattern.split("."), path.split(".") if path else [])


def repeated_blocks(model: nn.Module) -> list:
    """The outermost items of a ModuleList or ModuleDict."""
    out = []
    for name, module in model.named_modules():
        if isinstance(module, (nn.ModuleList, nn.ModuleDict)) and \
                not any(name.startswith(o + ".") for o, _ in out):
            out += [(f"{name}.{child}", m) for child, m in module.named_children()]
    return out


def selected(model: nn.Module, patterns: str) -> list:
    found = []
    for name, module in model.named_modules():
        if any(matches(p, name) for p in patterns.split(",")) and \
                not any(name.startswith(o + ".") for o, _ in found):
            found.append((name, module))
    return found


def checkpoint(model: nn.Module, patterns: str) -> None:
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    for name, module in selected(model, patterns):
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        wrapped = checkpoint_wrapper(module, preserve_rng_state=False)
        if isinstance(parent, nn.ModuleDict) or not child.isdigit():
            parent.register_module(child, wrapped)
        else:
            parent[int(child)] = wrapped


def tensor_parallel(model: nn.Module, tp: int, plan_file: str):
    """parallelize_module over the mesh's tp dimension; the mesh."""
    import json

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    mesh = init_device_mesh("cpu", (dist.get_world_size() // tp, tp),
                            mesh_dim_names=("dp", "tp"))
    with open(plan_file) as fh:
        plan = json.load(fh)
    styles = {"colwise": ColwiseParallel, "rowwise": RowwiseParallel}
    parallelize_module(model, mesh["tp"], {k: styles[v]() for k, v in plan.items()})
    return mesh


def shard(model: nn.Module, args, mesh=None) -> tuple:
    """(the model to call, the optimizer)."""
    group = mesh["dp"].get_group() if mesh is not None else None
    if mesh is not None and mesh["dp"].size() == 1:
        return model, torch.optim.AdamW(model.parameters(), lr=1e-3)
    if args.shard in ("replicate", "optimizer"):
        from torch.nn.parallel import DistributedDataParallel as DDP
        wrapped = DDP(model, process_group=group)
        if args.shard == "optimizer":
            from torch.distributed.optim import ZeroRedundancyOptimizer
            opt = ZeroRedundancyOptimizer(wrapped.parameters(),
                                          optimizer_class=torch.optim.AdamW, lr=1e-3)
        else:
            opt = torch.optim.AdamW(wrapped.parameters(), lr=1e-3)
        return wrapped, opt
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    kwargs = {}
    if args.param_dtype == "bf16":
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16)
    if args.shard == "gradients":
        kwargs["reshard_after_forward"] = False
    units = selected(model, args.shard_units) if args.shard_units else repeated_blocks(model)
    for _, unit in units:
        fully_shard(unit, **kwargs)
    fully_shard(model, **kwargs)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def top_level(model: nn.Module) -> list:
    """(path, parent, name) of the model's top-level sequence: its children in order, a
    ModuleList's or ModuleDict's items in place of the container."""
    out = []
    for name, child in model.named_children():
        if isinstance(child, (nn.ModuleList, nn.ModuleDict)):
            out += [(f"{name}.{key}", child, key) for key, _ in child.named_children()]
        else:
            out.append((name, model, name))
    return out


def _cut(model: nn.Module, sequence: list, keep: range) -> nn.Module:
    """``model`` with the items of ``sequence`` outside ``keep`` deleted (ends set to None)."""
    for i, (path, _, _) in reversed(list(enumerate(sequence))):
        if i in keep:
            continue
        parent_path, _, key = path.rpartition(".")
        if parent_path:
            container = model.get_submodule(parent_path)
            del container[key if isinstance(container, nn.ModuleDict) else int(key)]
        else:
            setattr(model, key, None)
    return model


def boundary_shapes(model: nn.Module, sequence: list, example) -> list:
    """The output of each item of the top-level sequence on ``example`` (meta tensors needing
    gradients where they are floating point), from a forward without autograd."""
    found = {}
    hooks = [model.get_submodule(path).register_forward_hook(
        lambda m, a, out, path=path: found.__setitem__(
            path, out.to("meta").requires_grad_(out.is_floating_point())))
        for path, _, _ in sequence]
    with torch.no_grad():
        model(example)
    for hook in hooks:
        hook.remove()
    return [found[path] for path, _, _ in sequence]


def pipeline_stages(model: nn.Module, splits: str, rank: int, world: int, example) -> list:
    """(stage index, its module, its input and output as meta tensors) of this rank's stages:
    the model cut before each module ``splits`` names; stage i on rank i mod world. The shapes
    are handed to PipelineStage, as torchtitan once did: no shape inference at the first step
    (whose forward with autograd stayed alive on the first stage under trace-run --memory,
    observed with torch 2.13 on paratrace 1ee8db1, whose recorder took saved tensors with a
    saved-tensor hook; trace-whatif does not model that forward)."""
    import copy
    sequence = top_level(model)
    cuts = [i for i, (path, _, _) in enumerate(sequence)
            if any(matches(p, path) for p in splits.split(","))]
    bounds = [0] + cuts + [len(sequence)]
    outputs = boundary_shapes(model, sequence, example)
    mine = [i for i in range(len(bounds) - 1) if i % world == rank]
    stages = []
    for i in mine:
        lo, hi = bounds[i], bounds[i + 1]
        module = model if len(mine) == 1 else copy.deepcopy(model)
        inputs = example.to("meta") if lo == 0 else outputs[lo - 1]
        stages.append((i, _cut(module, sequence, range(lo, hi)), inputs, outputs[hi - 1]))
    return stages, len(bounds) - 1


def pipeline(args) -> None:
    """Train with torch.distributed.pipelining: this rank's stages under the schedule."""
    from torch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe,
                                              ScheduleInterleaved1F1B)
    rank, world = dist.get_rank(), dist.get_world_size()
    mine, count = pipeline_stages(build(args.model), args.split, rank, world,
                                  batch(args.model, args.microbatch_size, 0)[0])
    stages = [PipelineStage(m, i, count, torch.device("cpu"), input_args=inputs,
                            output_args=outputs) for i, m, inputs, outputs in mine]

    def loss_fn(output, target):
        return loss_of(args.model, output, target)
    if args.schedule == "interleaved":
        schedule = ScheduleInterleaved1F1B(stages, n_microbatches=args.microbatches,
                                           loss_fn=loss_fn)
    else:
        single = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[args.schedule]
        schedule = single(stages[0], n_microbatches=args.microbatches, loss_fn=loss_fn)
    opt = torch.optim.AdamW([p for _, m, _, _ in mine for p in m.parameters()], lr=1e-3)
    first = any(i == 0 for i, _, _, _ in mine)
    last = any(i == count - 1 for i, _, _, _ in mine)
    for step in range(args.steps):
        x, y = batch(args.model, args.microbatch_size * args.microbatches, 1000 * step)
        inputs = (x,) if first else ()
        if last:
            schedule.step(*inputs, target=y, losses=[])
        else:
            schedule.step(*inputs)
        opt.step()
        opt.zero_grad(set_to_none=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=MODELS, required=True)
    parser.add_argument("--shard", choices=("replicate", "optimizer", "gradients", "full"),
                        default="replicate")
    parser.add_argument("--shard-units")
    parser.add_argument("--param-dtype", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--checkpoint")
    parser.add_argument("--microbatch-size", type=int, default=4)
    parser.add_argument("--grad-accum", type=int, default=1)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--tp-plan")
    parser.add_argument("--pp", type=int, default=1)
    parser.add_argument("--split")
    parser.add_argument("--schedule", choices=("gpipe", "1f1b", "interleaved"),
                        default="1f1b")
    parser.add_argument("--microbatches", type=int, default=1)
    args = parser.parse_args(argv)
    dist.init_process_group("gloo")
    if args.pp > 1:
        pipeline(args)
        dist.destroy_process_group()
        return
    rank = dist.get_rank() // args.tp          # the data-parallel rank: TP ranks share data
    model = build(args.model)
    mesh = tensor_parallel(model, args.tp, args.tp_plan) if args.tp > 1 else None
    if args.checkpoint:
        checkpoint(model, args.checkpoint)
    model, opt = shard(model, args, mesh)
    ddp = args.shard in ("replicate", "optimizer") and hasattr(model, "no_sync")
    for step in range(args.steps):
        for micro in range(args.grad_accum):
            last = micro == args.grad_accum - 1
            x, y = batch(args.model, args.microbatch_size, 1000 * step + 10 * micro + rank)
            with (model.no_sync() if ddp and not last else contextlib.nullcontext()):
                loss = loss_of(args.model, model(x), y) / args.grad_accum
                loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
