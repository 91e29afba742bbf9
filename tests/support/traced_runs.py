"""The traced runs of the reference GPT that several test files read (conftest.py makes them
session fixtures, each run once): TP=2 without SP x PP=2 on 4 ranks (gloo), for one step
(call graphs, the report) or two (the browser tests, docs/sql.md). Also runnable as a script,
to train under the tracer:

    torchrun --nproc-per-node 4 tests/support/traced_runs.py OUT_DIR [--calls] [train flags...]

``--calls`` also records, apart from the tracer, every call between functions of the run's own
code (sys.setprofile): ``OUT_DIR/calls-<rank>.json``, the call edges the call graph may show.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
if __package__ in (None, ""):     # run as a script: tests/ importable, as under pytest
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from support.paths import REPO  # noqa: E402

TP_FILE = str(REPO / "sample_runs" / "parallel" / "tensor_parallel.py")
LAYERS, MICROBATCHES = 2, 2
ARGS = ["--tp", "2", "--no-sp", "--pp", "2", "--schedule", "1f1b", "--layers", str(LAYERS),
        "--hidden", "32", "--heads", "4", "--seq-len", "16", "--micro-batch-size", "2",
        "--microbatches", str(MICROBATCHES), "--steps", "1", "--seed", "7"]
TWO_STEPS = [*ARGS[:ARGS.index("--steps")], "--steps", "2", *ARGS[ARGS.index("--steps") + 2:]]
# the run's own code: what the call graph draws as functions (torch and the stdlib are library)
OWN_CODE = (str(REPO / "sample_runs") + os.sep, __file__)


def trace_reference_gpt(out: Path, args: list, calls: bool = False) -> Path:
    """Train the reference GPT under the tracer on 4 ranks; traces in ``out/traces``."""
    from support import gpt_helpers
    proc = gpt_helpers.launch(4, [str(out / "traces"), *(["--calls"] if calls else []), *args],
                              script=__file__)
    assert proc.returncode == 0, f"traced run failed:\n{proc.stdout}\n{proc.stderr[-4000:]}"
    return out


def read_calls(traces: Path) -> dict:
    """rank -> set of call edges ((caller file, qualname), (callee file, qualname)) that
    ``--calls`` recorded; a caller of None is the outermost own frame."""
    out = {}
    for path in sorted(traces.glob("calls-*.json")):
        edges = json.loads(path.read_text())
        out[int(path.stem.split("-")[1])] = {
            (tuple(a) if a else None, tuple(b)) for a, b in edges}
    return out


class CallRecorder:
    """Call edges between functions of the run's own code, from Python's profiling hook: for
    each call of an own function, the nearest own function up the stack (library frames such
    as torch.nn.Module.__call__ in between are skipped, as the call graph skips them)."""

    def __init__(self):
        self.edges: set = set()
        self.qualnames: dict = {}         # code -> its function's __qualname__ (Python 3.10)

    @staticmethod
    def own(code) -> bool:
        return code.co_filename.startswith(OWN_CODE)

    def key(self, frame) -> tuple:
        """(file, qualified name): the code's own (Python 3.11 on), else that of the function
        object that holds the code (Python 3.10; found once per code)."""
        code = frame.f_code
        if hasattr(code, "co_qualname"):
            return (code.co_filename, code.co_qualname)
        if code not in self.qualnames:
            import gc
            functions = [f for f in gc.get_referrers(code) if getattr(f, "__code__", None) is code]
            self.qualnames[code] = functions[0].__qualname__ if functions else code.co_name
        return (code.co_filename, self.qualnames[code])

    def caller(self, frame):
        up = frame.f_back
        while up is not None and not self.own(up.f_code):
            up = up.f_back
        return None if up is None else self.key(up)

    def __call__(self, frame, event, arg) -> None:
        if event == "call" and self.own(frame.f_code):
            self.edges.add((self.caller(frame), self.key(frame)))

    def start(self) -> None:
        """Record from here on, on every thread; the frames already running count as called."""
        frame = sys._getframe(1)
        while frame is not None:
            if self.own(frame.f_code):
                self.edges.add((self.caller(frame), self.key(frame)))
            frame = frame.f_back
        import threading
        threading.setprofile(self)
        sys.setprofile(self)

    def write(self, path: str) -> None:
        sys.setprofile(None)
        with open(path, "w") as fh:
            json.dump(sorted(self.edges, key=repr), fh)


def _traced_main() -> None:
    sys.path.insert(0, str(REPO))
    import tracer
    from sample_runs.train import main

    traces_dir, argv = sys.argv[1], sys.argv[2:]
    calls = CallRecorder() if argv[:1] == ["--calls"] else None
    argv = argv[1:] if calls else argv
    with tracer.trace(traces_dir):
        if calls:
            calls.start()
        main(argv)
        if calls:
            calls.write(os.path.join(traces_dir, f"calls-{os.environ.get('RANK', '0')}.json"))


if __name__ == "__main__":
    _traced_main()
