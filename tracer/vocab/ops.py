"""Tables that classify dispatched ops: which ones are communication, and how to read them.

Every collective API of torch reaches the dispatcher as one of a few op families (see
docs/oracles.md): c10d ops (``c10d.allreduce_`` ...) carrying a ProcessGroup script object,
functional collectives (``_c10d_functional.all_reduce`` ...) carrying a group name, and their
autograd variants. The tracer never branches on op names in its hot path: it looks each op up once
here, caches the resulting :class:`OpSpec`, and from then on only reads the spec.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Optional

# Normalized kinds of summary.json's contract (docs/contract.md).
KINDS = (
    "all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "gather", "scatter",
    "all_to_all", "barrier", "send", "recv",
)
# Point-to-point kinds: their sequence numbers count apart from the group's collectives.
P2P_KINDS = ("send", "recv")

# Base op name (namespace and overload stripped, trailing "_" of in-place variants stripped) -> kind.
_KIND_BY_BASE = {
    "allreduce": "all_reduce", "allreduce_coalesced": "all_reduce", "all_reduce": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "allgather": "all_gather", "_allgather_base": "all_gather", "allgather_coalesced": "all_gather",
    "allgather_into_tensor_coalesced": "all_gather", "all_gather_into_tensor": "all_gather",
    "all_gather_into_tensor_out": "all_gather", "all_gather_into_tensor_coalesced": "all_gather",
    "reduce_scatter": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
    "broadcast": "broadcast", "reduce": "reduce", "gather": "gather", "scatter": "scatter",
    "alltoall": "all_to_all", "alltoall_base": "all_to_all", "all_to_all_single": "all_to_all",
    "barrier": "barrier", "monitored_barrier": "barrier",
    "send": "send", "recv": "recv", "recv_any_source": "recv",
}

C10D_NAMESPACES = ("c10d",)
FUNCTIONAL_NAMESPACES = ("_c10d_functional", "_c10d_functional_autograd", "c10d_functional")

# Argument names, by preference, that hold the tensors this rank hands to the collective.
_INPUT_ARGS = ("input_tensors", "input_tensor", "input", "inputs", "input_list", "tensors",
               "tensor", "self")
_PEER_ARGS = ("dstRank", "srcRank", "root_rank", "dst", "src", "root")
_OUTPUT_ARGS = ("output_tensors", "output_tensor", "output", "outputs", "output_lists")

# Pseudo-ops the tracer writes itself (never dispatched by torch).
OP_COMPLETE = "paratrace::complete"     # completion of a collective flushed before it finished
OP_ANNOTATION = "paratrace::annotation"  # one tracer.annotate / record_function range
OP_STEP = "paratrace::step"              # a step boundary
OP_PG_INIT = "paratrace::init_process_group"   # torch.distributed.init_process_group's call
PSEUDO_OPS = (OP_COMPLETE, OP_ANNOTATION, OP_STEP, OP_PG_INIT)

RF_ENTER = "rf_enter"
RF_EXIT = "rf_exit"
WAIT = "wait"
HOP = "higher_order"                     # a HigherOrderOperator (recorder/frameworks/hops.py)


@dataclass(frozen=True)
class CommSpec:
    """How to read one communication op's arguments (indices into the positional args)."""

    kind: str
    api: str                    # "c10d" or "functional"
    input_arg: Optional[int]    # tensors this rank contributes (for bytes, dtype)
    group_arg: Optional[int]    # ProcessGroup script object (c10d) or group name (functional)
    peer_arg: Optional[int]     # peer / root rank, group-local
    async_arg: Optional[int]    # c10d async_op flag
    async_default: Optional[bool] = None   # its schema default, when the caller omitted it
    output_arg: Optional[int] = None       # tensors it writes (the dtype of a rank handing none)


@dataclass(frozen=True)
class OpSpec:
    """What the tracer needs to know of one dispatched op overload, computed once."""

    name: str                   # "aten.mm.default"
    comm: Optional[CommSpec] = None
    special: Optional[str] = None   # RF_ENTER, RF_EXIT, WAIT, HOP or None


def _arg_index(schema: Any, names: Iterable[str]) -> Optional[int]:
    args = [a.name for a in schema.arguments]
    for name in names:
        if name in args:
            return args.index(name)
    return None


def kind_of(base: str) -> Optional[str]:
    """The normalized kind of a communication op's base name, or None if it is not communication."""
    return _KIND_BY_BASE.get(base.rstrip("_"))


def classify(func: Any) -> OpSpec:
    """Build the :class:`OpSpec` of a dispatched OpOverload."""
    name = str(func)
    namespace = getattr(func, "namespace", name.split(".", 1)[0])
    base = name.split(".")[1] if name.count(".") >= 1 else name
    if namespace == "higher_order":       # torch.cond, flex_attention... (all HOPs live here)
        return OpSpec(f"higher_order.{base}", special=HOP)
    if namespace == "profiler":
        if base == "_record_function_enter_new" or base == "_record_function_enter":
            return OpSpec(name, special=RF_ENTER)
        if base == "_record_function_exit":
            return OpSpec(name, special=RF_EXIT)
        return OpSpec(name)
    if namespace in FUNCTIONAL_NAMESPACES and base == "wait_tensor":
        return OpSpec(name, special=WAIT)
    if namespace not in C10D_NAMESPACES and namespace not in FUNCTIONAL_NAMESPACES:
        return OpSpec(name)
    kind = kind_of(base)
    if kind is None:
        return OpSpec(name)
    schema = func._schema
    if namespace in C10D_NAMESPACES:
        group_arg = next((i for i, a in enumerate(schema.arguments)
                          if "ProcessGroup" in str(a.type)), None)
        async_arg = _arg_index(schema, ("async_op", "asyncOp"))
        default = schema.arguments[async_arg].default_value if async_arg is not None else None
        spec = CommSpec(kind, "c10d", _arg_index(schema, _INPUT_ARGS), group_arg,
                        _arg_index(schema, _PEER_ARGS), async_arg,
                        None if default is None else bool(default),
                        _arg_index(schema, _OUTPUT_ARGS))
    else:
        spec = CommSpec(kind, "functional", _arg_index(schema, _INPUT_ARGS),
                        _arg_index(schema, ("group_name", "tag")),
                        _arg_index(schema, _PEER_ARGS), None)
    if kind == "barrier":
        spec = CommSpec(kind, spec.api, None, spec.group_arg, None, spec.async_arg,
                        spec.async_default)
    return OpSpec(name, comm=spec)


_DTYPE_NAMES: dict[Any, str] = {}


def dtype_name(dtype: Any) -> str:
    """Short dtype name: torch.float32 -> 'f32', torch.bfloat16 -> 'bf16'."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        full = str(dtype).replace("torch.", "")
        short = {"float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16",
                 "int64": "i64", "int32": "i32", "int16": "i16", "int8": "i8", "uint8": "u8",
                 "bool": "b8", "complex64": "c64", "complex128": "c128"}
        name = _DTYPE_NAMES[dtype] = short.get(full, full)
    return name
