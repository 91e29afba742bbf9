"""Types of the C extension tracer.recorder._hotpath (csrc/hotpath/): the recorder's hot path in
C. Its Python twins: Session.on_op (session.py), _PyStackWalk (attribution/stacks.py),
_PyShapeKeys (attribution/shapes.py), PyStorageTable (memory/storage_table.py).
tests/unit/test_extension_stubs.py holds these names equal to the module's."""
from types import FrameType
from typing import Any, Callable

MAX_NODES: int
MAX_QUEUE: int
ROW_FIELDS: int
PHASE_FORWARD: int
PHASE_BACKWARD: int
PHASE_OPTIMIZER: int
PHASE_GRAD_SYNC: int
PHASE_RECOMPUTE: int
PHASE_OTHER: int

def now() -> int:
    """The C path's clock: time.perf_counter_ns's, in ns."""

class SessionState:
    """The fields of Session that on_op's C path reads (its base class)."""
    step_index: int
    passthrough: bool
    device_wanted: bool
    pg_seen: bool
    _record_stacks: bool
    _record_shapes: bool
    open_ranges: int
    recompute: int
    in_optimizer: int
    _last_seq: int
    _last_event_ns: int
    _specs: dict[Any, Any]
    _queue: list[Any]
    push: Callable[..., Any]
    _threads: dict[int, int]
    fwd_of_node: dict[int, int]
    fwd_prev: dict[int, Any]
    _funcol: dict[int, Any]
    _futures: dict[int, Any]
    _modules: Any
    _annotations: Any
    _stacks: Any
    _signatures: Any
    _rules: Any
    _torch_state: Any
    memory_table: Any
    @property
    def _c_ready(self) -> bool:
        """Whether on_op's C path can run for this session."""

class OpDispatch:
    """OpDispatch(mode, session, fallback): the recording mode's __torch_dispatch__ with
    on_op's common path in C (hotpath/_mode.py)."""
    session: SessionState
    fallback: Callable[..., Any]
    def __init__(self, mode: Any, session: SessionState,
                 fallback: Callable[..., Any]) -> None: ...
    def __call__(self, func: Any, types: Any, args: tuple[Any, ...] = ...,
                 kwargs: dict[str, Any] | None = ...) -> Any: ...

class StackWalk:
    """StackInterner's capture in C."""
    kind_of_code: dict[Any, int]
    _siblings: dict[Any, Any]
    _node_sid: dict[Any, int]
    _path: list[Any]
    _path_pos: dict[Any, int]
    _last_start: Any
    _last_entry: Any
    _last_lasti: int
    _last_sid: int
    def capture(self, frame: FrameType | None) -> int:
        """Intern the stack that starts at frame (innermost) and return its id."""

class ShapeKeys:
    """ShapeSignatures' key in C."""
    _byte_ids: dict[Any, int]
    _dtype_attr: Any
    _shape_attr: Any
    _kind_of_type: dict[type, int]
    _kind: Any
    _tensor: type
    _parameter: type
    def id_of(self, args: tuple[Any, ...]) -> int:
        """The signature id of an op's positional arguments (their tensors' dtypes and
        shapes)."""

class StorageTable:
    """Memory recording's storage table in C (PyStorageTable's twin)."""
    live: dict[int, Any]
    def __init__(self, session: SessionState, storage_key: Callable[[Any], int],
                 tensor_type: type, returns_only_aliases: Any) -> None: ...
    def outputs(self, func: Any, out: Any, t0: int, thread: int, comm: int) -> None: ...
    def node_runs(self, node: Any, nseq: int) -> None: ...
    def saved(self, tensor: Any) -> None: ...
    def claim(self, tensor: Any, category: int) -> None: ...
    def resized(self, storage: Any) -> None: ...
    def take(self) -> bytes:
        """The events since the last take, packed (storage_table.EVENT each)."""
    def close(self) -> None:
        """Forget the table: no more frees."""
