"""A thread with no Python frame above the recording mode, on the CPU: what autograd's CUDA
device threads are (test_tracer_threads.py). A thread started from C (``_thread``) whose whole
work is builtins, ``list(map(call, [...]))`` over ``functools.partial``s of torch's C
functions, has no Python frame until the mode's dispatch."""
from __future__ import annotations

import _thread
import functools
import inspect
import operator
import os

import torch

import tracer

HERE = os.path.abspath(__file__)
CALL = operator.methodcaller("__call__")    # C: calls each partial without a Python frame


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        return torch.tanh(self.fc(x))            # FC_LINE


FC_LINE = next(i for i, line in enumerate(inspect.getsource(Net).splitlines())
               if "FC_LINE" in line) + inspect.getsourcelines(Net)[1]


# the qualname a stack gives Net.forward (on Python 3.10 too: tracer.recorder.attribution.qualnames)
QUALNAME = Net.forward.__qualname__


def run_frameless(calls: list) -> None:
    """Run ``calls`` (partials of C functions) in order on a new thread that has no Python
    frame; fail the test if they did not all finish in 60 s (an exception there is printed by
    _thread and stops the chain before the lock is released)."""
    done = _thread.allocate_lock()
    done.acquire()
    _thread.start_new_thread(list, (map(CALL, calls + [done.release]),))
    assert done.acquire(timeout=60), "the frameless thread failed (its error is on stderr)"


def frameless_backward_and_forward(out: str) -> "tracer.Trace":
    """Forward on this thread; backward (and one forward mm) on a frameless thread, with the
    recording mode pushed on that thread's dispatch stack as autograd's device threads have it."""
    torch.manual_seed(0)
    net = Net()
    x = torch.randn(3, 8)
    a, b = torch.randn(4, 5), torch.randn(5, 6)
    with tracer.trace(out, clock_sync=False, device_time=False):
        loss = net(x).sum()
        mode = torch._C._get_dispatch_stack_at(torch._C._len_torch_dispatch_stack() - 1)
        engine = torch.autograd.Variable._execution_engine
        run_frameless([
            functools.partial(torch._C._push_on_torch_dispatch_stack, mode),
            # loss.backward(), as the engine's C entry point takes it: outputs, grads,
            # keep_graph, create_graph, inputs, allow_unreachable, accumulate_grad
            functools.partial(engine.run_backward, (loss,), (torch.ones_like(loss),), False,
                              False, (), True, True),
            functools.partial(torch.mm, a, b),
            functools.partial(torch._C._pop_torch_dispatch_stack, None),
        ])
        assert net.fc.weight.grad is not None
    return tracer.load(os.path.join(out, "rank-0.arrow"))


def check_frameless_trace(trace) -> None:
    events = trace.records()
    # the stack column's code of each event: the empty stack is a stack (``[]`` in the
    # dictionary), not the absent one (-1, stacks off)
    codes, texts = trace.col("stack"), trace.dictionary("stack")
    for e, code in zip(events, codes):
        e["stack_text"] = texts[code] if code >= 0 else None
    forward = [e for e in events if e["op"] == "aten.addmm.default"]
    assert len(forward) == 1 and forward[0]["phase"] == "forward"
    main_thread = forward[0]["thread"]
    backward = [e for e in events if e["phase"] == "backward"]
    # tanh's backward, the bias sum and the weight mm at least: independent of torch's exact
    # decomposition, every one of them ran on the frameless thread
    names = {e["op"] for e in backward}
    assert {"aten.tanh_backward.default", "aten.mm.default", "aten.sum.dim_IntList"} <= names
    for e in backward:
        assert e["thread"] != main_thread
        assert e["stack_text"] == "[]"                    # no Python frame called it
    # the weight gradient's mm keeps what it has on the CPU: the forward line and module
    mm = [e for e in backward if e["op"] == "aten.mm.default"]
    assert mm and all(e["module"] == "Net.fc" for e in mm)
    for e in mm:
        user = [f for f in e["fwd_stack"] if f[0] == HERE]
        assert user and user[0][1] == FC_LINE and user[0][3] == QUALNAME
    # a forward op on the frameless thread: recorded, with the empty stack
    mm_fwd = [e for e in events if e["op"] == "aten.mm.default" and e["phase"] != "backward"]
    assert len(mm_fwd) == 1 and mm_fwd[0]["stack_text"] == "[]"
    assert mm_fwd[0]["thread"] != main_thread
