"""Every attribute a trace replaces in torch and os (tracer/recorder/patches), listed by hand
as [owner, name]: the independent list the patch tests hold the recorder to."""
from __future__ import annotations


_STAGE = "torch.distributed.pipelining.stage._PipelineStageBase"


_SCHEDULES = "torch.distributed.pipelining.schedules"


CORE = [
    ["torch.utils.checkpoint", "_CheckpointFrame"],
    ["torch.utils.checkpoint", "_recomputation_hook"],
    ["torch.utils.checkpoint.CheckpointFunction", "forward"],
    ["torch.autograd", "_make_grads"],
    ["torch._C._distributed_c10d.Reducer", "_rebuild_buckets"],
    ["torch.nn.parallel.DistributedDataParallel", "__init__"],
    ["torch._C._distributed_c10d.Work", "wait"],
    ["torch.distributed.distributed_c10d", "init_process_group"],
    ["torch.distributed", "init_process_group"],
    ["torch.distributed.distributed_c10d", "destroy_process_group"],
    ["torch.distributed", "destroy_process_group"],
    ["torch._dynamo.eval_frame.OptimizedModule", "__call__"],
    ["torch._dynamo.output_graph.OutputGraph", "call_user_compiler"],
    ["torch._dynamo.convert_frame", "_compile"],
    ["torch._higher_order_ops.wrap.TagActivationCheckpoint", "__call__"],
    ["os", "_exit"],
    ["torch.autograd.profiler", "_prepare_profiler"],
    ["torch.autograd.profiler", "_disable_profiler"],
    # while memory is recorded, the default (tracer/recorder/patches/storage.py)
    ["torch.storage.UntypedStorage", "resize_"],
    # FSDP2 (tracer/recorder/patches/fsdp.py): imported with torch._dynamo, before any trace starts
    ["torch.distributed.fsdp._fully_shard._fsdp_param_group.FSDPParamGroup", "unshard"],
    ["torch.distributed.fsdp._fully_shard._fsdp_param_group.FSDPParamGroup", "post_backward"],
    ["torch.distributed.fsdp._fully_shard._fsdp_param_group.FSDPParamGroup", "pre_backward"],
    ["torch.distributed.fsdp._fully_shard._fsdp_param_group.FSDPParamGroup",
     "_prefetch_unshard"],
    ["torch.distributed.fsdp._fully_shard._fsdp_state.FSDPState", "_pre_backward"],
    # DeviceMesh's groups named by their dimensions (patches/distributed.py): imported with
    # FSDP2, so there from the trace's start
    ["torch.distributed.device_mesh.DeviceMesh", "__init__"],
    ["torch.distributed.device_mesh.DeviceMesh", "get_group"],
]


PIPELINING = [[_STAGE, name] for name in (
    "forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk",
    "perform_reduce_grad", "scale_grads", "get_fwd_send_ops", "get_fwd_recv_ops",
    "get_bwd_send_ops", "get_bwd_recv_ops")] + [
    [f"{_SCHEDULES}._PipelineSchedule", "_maybe_compute_loss"],
    [f"{_SCHEDULES}._PipelineSchedule", "_initialize_pp_stages"],
    [f"{_SCHEDULES}.PipelineScheduleSingle", "step"],
    [f"{_SCHEDULES}.PipelineScheduleMulti", "step"],
    [_SCHEDULES, "_batch_p2p"],
]


def in_this_torch(targets: list) -> list:
    """The targets the installed torch has: one it lacks is not there to replace (before 2.13,
    the pipelining schedules have no _initialize_pp_stages: docs/compat.md)."""
    import pkgutil

    def has(owner_path: str, name: str) -> bool:
        try:
            return hasattr(pkgutil.resolve_name(owner_path), name)
        except (ImportError, AttributeError, ValueError):
            return False
    return [target for target in targets if has(*target)]
