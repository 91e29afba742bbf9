"""Ops dispatched on a thread with no Python frame above the mode: on CUDA, autograd runs every
backward on its own device thread, where the mode's ``__torch_dispatch__`` is the outermost
Python frame. The CPU reproduces it (tests/support/frameless_thread.py). Both hot paths (C and its
Python twin) must record such ops: a backward op keeps its forward op's stack and module, its
own stack is the empty one."""
from __future__ import annotations

import os
import subprocess
import sys

from support.frameless_thread import check_frameless_trace, frameless_backward_and_forward
from support.paths import TESTS



def test_a_frameless_thread_records_backward_and_forward_ops(tmp_path):
    check_frameless_trace(frameless_backward_and_forward(str(tmp_path)))


def test_a_frameless_thread_records_on_the_python_twin(tmp_path):
    """The same in a process whose hot path is Python (PARATRACE_PURE_PYTHON=1)."""
    code = ("import sys; sys.path.insert(0, %r); import support.frameless_thread as t; "
            "t.check_frameless_trace(t.frameless_backward_and_forward(%r)); "
            "import tracer.recorder.attribution.stacks as s; print(s.StackInterner.HOT_PATH)"
            % (str(TESTS), str(tmp_path)))
    env = dict(os.environ, PARATRACE_PURE_PYTHON="1", CUDA_VISIBLE_DEVICES="")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-1] == "python"
