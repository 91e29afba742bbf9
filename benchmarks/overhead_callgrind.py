"""benchmarks/overhead.py --instructions: each recorder's instructions a step under valgrind's
callgrind, all threads and the main thread, which a loaded machine cannot disturb.

Each recorder runs in a process of its own (``overhead.py --one-run RECORDER MODEL STEPS
--handshake DIR``) with callgrind's instrumentation off until the warm-up steps are done
(:func:`handshake`), so imports and warm-up cost little.
"""
from __future__ import annotations

import gc
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time

import tracer
from overhead_recorders import (MEMORY, PROFILE_MEMORY, UNWRAPPED, Recorders, ops_per_step,
                                step_times)

OVERHEAD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "overhead.py")


def instructions(recorders: Recorders, models: list, steps: int = 4) -> None:
    """Instructions a step (all threads) of each recorder under valgrind's callgrind: what a
    loaded machine cannot disturb. Only the `steps` steps after the warm-up steps are counted:
    the process starts with callgrind's instrumentation off and `callgrind_counts` turns it on
    and off (callgrind_control) when the run says it reached them, so imports and warm-up cost
    little."""
    names = ["untraced", "no-op dispatch mode", UNWRAPPED, "paratrace",
             "paratrace, unrecorded step", MEMORY, PROFILE_MEMORY,
             *[n for n in recorders.factories if n.endswith("Python hot path")],
             *recorders.ablations]
    for model in models:
        recorders.model = model
        step_times(model, 3, recorders.paratrace)
        per_op = ops_per_step(tracer.load(recorders.last_trace[model]))
        per_step = {name: [n / steps for n in callgrind_counts(name, model, steps)]
                    for name in names}
        print(f"\n{model}: instructions a step under callgrind ({per_op} ops a step); "
              f"all threads, then the main thread alone")
        print(f"{'recorder':28s}" + f" {'per step':>10s} {'extra/op':>9s} {'x floor':>8s}" * 2)
        for name, counts in per_step.items():
            line = f"{name:28s}"
            for i, count in enumerate(counts):
                base, floor = per_step["untraced"][i], per_step["no-op dispatch mode"][i]
                line += (f" {count / 1e6:9.1f}M {(count - base) / per_op:9.0f} "
                         f"{(count - base) / (floor - base):8.2f}")
            print(line)


def callgrind_counts(name: str, model: str, steps: int) -> tuple:
    """Instructions of `steps` steps (after two warm-up steps) of one recorder on one model:
    (every thread's, the main thread's)."""
    tag = tempfile.mkdtemp(prefix="paratrace-callgrind-")
    cmd = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--separate-threads=yes",
           f"--callgrind-out-file={tag}/out.%p", sys.executable,
           OVERHEAD,
           "--one-run", name, model, str(steps + 2), "--handshake", tag]
    try:
        # string hashes decide dict and set layouts: fixed, so that runs repeat exactly
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        log = os.path.join(tag, "stderr")         # a file: a full pipe would stall the run
        with open(log, "w") as err:
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env)
        for marker, command in (("ready", "on"), ("done", "off")):
            while not os.path.exists(os.path.join(tag, marker)):
                if proc.poll() is not None:
                    with open(log) as f:
                        raise SystemExit(f"overhead.py: {name} under callgrind exited with "
                                         f"{proc.returncode}: {f.read()[-2000:]}")
                time.sleep(0.1)
            subprocess.run(["callgrind_control", "-i", command, str(proc.pid)], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            open(os.path.join(tag, marker + ".ack"), "w").close()
        if proc.wait():
            with open(log) as f:
                raise SystemExit(f"overhead.py: {name} under callgrind exited with "
                                 f"{proc.returncode}: {f.read()[-2000:]}")
        total = main = 0
        for path in sorted(glob.glob(os.path.join(tag, "out.*"))):
            with open(path) as f:
                count = sum(int(line.split()[1]) for line in f
                            if line.startswith(("summary:", "totals:")))
            keep = os.environ.get("CALLGRIND_KEEP")     # a directory for callgrind_annotate
            if keep:
                shutil.copy(path, os.path.join(keep, f"{name.replace(' ', '_')}."
                                                     f"{os.path.basename(path)}"))
            if os.environ.get("CALLGRIND_THREADS"):
                print(f"  {name} {os.path.basename(path)}: {count / 1e6:.1f}M", file=sys.stderr)
            total += count
            if path.endswith("-01"):          # callgrind numbers threads from 1: the main one
                main = count
        return total, main
    finally:
        shutil.rmtree(tag, ignore_errors=True)


def handshake(tag: str, warm_steps: int):
    """An optimizer step hook for `--one-run --handshake`: after the warm-up steps it says
    "ready" and waits until the counting is on; at the end of the run "done" (see
    callgrind_counts)."""
    count = [0]

    def say(marker: str) -> None:
        open(os.path.join(tag, marker), "w").close()
        while not os.path.exists(os.path.join(tag, marker + ".ack")):
            time.sleep(0.02)

    def hook(*_):
        count[0] += 1
        if count[0] == warm_steps:
            gc.collect()      # every run starts counting with the collector's generations empty
            say("ready")
    return hook, lambda: say("done")
