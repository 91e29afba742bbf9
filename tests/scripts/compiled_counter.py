"""An independent count of what a traced script runs, for the torch.compile tests: a
TorchDispatchMode of the script's own that runs compiled (its ``ignore_compile_internals`` is
True, as the recorder's is: a mode that says False makes Dynamo skip every frame, and the
script would run eagerly). It sits *below* the recorder's mode on torch's dispatch stack
(collective_counter.py's install_below), so it sees every op the recorder passes on.

Per section (a name the script sets, with its iteration), it counts by op name the ops that
ran, apart from those it saw while Dynamo compiled (torch._guards.CompileContext set: Dynamo's
tracing on fake tensors, the backend's compilation), and the collectives by kind (its own
table, collective_counter.KINDS), with those launched while the autograd engine ran."""
import json

import torch
from torch._guards import CompileContext
from torch.utils._python_dispatch import TorchDispatchMode

from collective_counter import KINDS, NAMESPACES, CollectiveCounter


class CompiledCounter(TorchDispatchMode):
    supports_higher_order_operators = True

    def __init__(self):
        super().__init__()
        self.section = None          # "label/iteration" while the script counts, else None
        self.sections: dict = {}

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self.section is not None:
            counts = self.sections.setdefault(self.section, {
                "ran": {}, "compiling": {}, "collectives": {}, "in_backward": {}})
            name = str(func)
            where = "compiling" if CompileContext.current_compile_id() is not None else "ran"
            counts[where][name] = counts[where].get(name, 0) + 1
            kind = KINDS.get(name.split(".")[1]) if getattr(func, "namespace", "") in \
                NAMESPACES else None
            if kind is not None and where == "ran":
                counts["collectives"][kind] = counts["collectives"].get(kind, 0) + 1
                if torch._C._current_graph_task_id() >= 0:
                    counts["in_backward"][kind] = counts["in_backward"].get(kind, 0) + 1
        return func(*args, **(kwargs or {}))

    install_below = CollectiveCounter.install_below

    def dump(self, path: str) -> None:
        with open(path, "w") as fh:
            json.dump(self.sections, fh)
