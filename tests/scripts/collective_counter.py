"""An independent count of the collectives a traced script runs, for the framework tests: a
TorchDispatchMode of the script's own that counts every c10d and functional collective op by
kind, with its own name table (not paratrace's). It sits *below* the recorder's mode on torch's
dispatch stack, so the recorder still sees each op first (its stacks end in the framework's
code, not here) and this mode sees what the recorder passes on: every op torch runs.

The recorder's clock alignment (ping-pong sends and receives when the process group appears
and before it goes) reaches this mode too; compare collectives other than send/recv."""
import json
import os

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# op base name (namespace and overload stripped) -> kind; a table of its own, on purpose
KINDS = {"allreduce_": "all_reduce", "allreduce_coalesced_": "all_reduce",
         "all_reduce": "all_reduce", "all_reduce_": "all_reduce",
         "allgather_": "all_gather", "_allgather_base_": "all_gather",
         "allgather_into_tensor_coalesced_": "all_gather", "all_gather_into_tensor": "all_gather",
         "all_gather_into_tensor_out": "all_gather", "reduce_scatter_": "reduce_scatter",
         "_reduce_scatter_base_": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
         "broadcast_": "broadcast", "barrier": "barrier", "send": "send", "recv_": "recv",
         "alltoall_base_": "all_to_all", "all_to_all_single": "all_to_all",
         "gather_": "gather", "scatter_": "scatter", "reduce_": "reduce"}
NAMESPACES = ("c10d", "_c10d_functional", "_c10d_functional_autograd")


class CollectiveCounter(TorchDispatchMode):
    supports_higher_order_operators = True
    # the functional collectives' tensor wrapping (DTensor's redistributions): not collectives
    _NOT_COMM = frozenset({"wait_tensor", "_wrap_tensor_autograd"})

    def __init__(self):
        super().__init__()
        self.counts: dict = {}         # kind -> calls
        self.in_backward: dict = {}    # kind -> calls while the autograd engine ran
        self.unknown: dict = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        namespace = getattr(func, "namespace", "")
        if namespace in NAMESPACES:
            base = str(func).split(".")[1]
            kind = KINDS.get(base)
            if kind is not None:
                self.counts[kind] = self.counts.get(kind, 0) + 1
                # launched while the autograd engine runs (a node, or its final callbacks)
                if torch._C._current_graph_task_id() >= 0:
                    self.in_backward[kind] = self.in_backward.get(kind, 0) + 1
            elif base not in self._NOT_COMM:
                self.unknown[base] = self.unknown.get(base, 0) + 1
        return func(*args, **(kwargs or {}))

    def install_below(self) -> "CollectiveCounter":
        """Push this mode under every mode already on the stack (the recorder's)."""
        above = [torch._C._pop_torch_dispatch_stack(None)
                 for _ in range(torch._C._len_torch_dispatch_stack())]
        torch._C._push_on_torch_dispatch_stack(self)
        for mode in reversed(above):
            torch._C._push_on_torch_dispatch_stack(mode)
        return self

    def dump(self, path: str) -> None:
        with open(path, "w") as fh:
            json.dump({"counts": self.counts, "in_backward": self.in_backward,
                       "unknown": self.unknown}, fh)


def rank() -> int:
    return int(os.environ.get("RANK", "0"))
