"""Helpers for the tests that start ranks: run sample_runs.train (or a test script of
tests/scripts) in real processes (torchrun with gloo on CPU) and read back its --dump.
"""
from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Optional

import numpy as np
from support.paths import REPO, SCRIPTS

TINY = ["--layers", "4", "--hidden", "32", "--heads", "4", "--seq-len", "16",
        "--micro-batch-size", "2", "--steps", "3", "--seed", "7"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def env() -> dict:
    """The environment of the reference GPT's processes: support.cli.ENV (the CPU and gloo,
    also where GPUs are), this checkout importable, no warnings."""
    from support.cli import ENV
    return {**ENV, "PYTHONPATH": str(REPO), "PYTHONWARNINGS": "ignore"}


def launch(nproc: int, args: list[str], *, script: Optional[str] = None,
           timeout: float = 240) -> subprocess.CompletedProcess:
    """Run ``python -m sample_runs.train args`` (or ``script``) on ``nproc`` ranks; one rank
    runs as a plain process, without torch.distributed."""
    target = [script] if script else ["-m", "sample_runs.train"]
    if nproc == 1 and script is None:
        cmd = [sys.executable, *target, *args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
               "--master-addr", "127.0.0.1", "--master-port", str(free_port()), *target, *args]
    return subprocess.run(cmd, cwd=REPO, env=env(), capture_output=True, text=True,
                          timeout=timeout)


def torchrun(script: str, out: Path, nproc: int = 2) -> None:
    """Run ``tests/scripts/<script> OUT`` on ``nproc`` ranks; it must succeed."""
    proc = launch(nproc, [str(out)], script=str(SCRIPTS / script))
    assert proc.returncode == 0, proc.stderr[-4000:]


class _Picked:
    """One layout's result out of a launch that trained several (a future's interface)."""

    def __init__(self, launch, name: str):
        self._launch, self._name = launch, name

    def result(self) -> dict:
        return self._launch.result()[self._name]


def runs_in_background(tmp_path: Path, runs: list, traced: Optional[dict] = None,
                       dump: bool = True):
    """For a module fixture (``yield from``): :func:`train_many` on a pool of two launches at a
    time. Each test waits for its own runs only, so no single test (nor the fixture's setup)
    carries the whole file's launches against a per-test timeout."""
    from concurrent.futures import ThreadPoolExecutor
    pool = ThreadPoolExecutor(max_workers=2)
    try:
        yield train_many(pool, runs, tmp_path, traced, dump)
    finally:
        pool.shutdown(wait=True)


def assert_same_numbers(run: dict, reference: dict, steps: Optional[int] = None) -> None:
    """``run``'s losses (its first ``steps``, default all) and step-1 gradients are the
    reference's."""
    steps = len(run["losses"]) if steps is None else steps
    np.testing.assert_allclose(run["losses"], reference["losses"][:steps], rtol=1e-5)
    assert run["grads"].keys() == reference["grads"].keys()
    for key, ref in reference["grads"].items():
        scale = np.abs(ref).max()
        np.testing.assert_allclose(run["grads"][key], ref, rtol=1e-4, atol=1e-5 * scale,
                                   err_msg=key)


def train_many(pool, runs: list, tmp_path: Path, traced: Optional[dict] = None,
               dump: bool = True) -> dict:
    """Train each ``(name, ranks, flags)`` of ``runs`` (after the tiny sizes of TINY) with
    --dump and --dump-grads, one launch per world size (tests/scripts/train_layouts.py trains
    the layouts one after another in the same processes), submitted to ``pool``. Returns name
    -> an object whose ``result()`` is that layout's dump: {"losses", "grads": {name: array},
    "stdout"}. ``traced``: name -> (ranks, flags) of runs to train one step under the tracer
    instead, in the same launches; their results are {"records": each rank's records, "dump",
    "config": the configuration rank 0 recorded}; ``dump=False``: the traced runs dump nothing
    (no gathering of gradients in their traces; their "dump" is None)."""
    by_world: dict = {}
    for name, ranks, flags in runs:
        by_world.setdefault(ranks, []).append((name, flags, False))
    for name, (ranks, flags) in (traced or {}).items():
        by_world.setdefault(ranks, []).append((name, [*flags, "--steps", "1"], True))
    out = {}
    for ranks, layouts in by_world.items():
        launch = pool.submit(_train_layouts, ranks, layouts, tmp_path, dump)
        out.update({name: _Picked(launch, name) for name, _, _ in layouts})
    return out


def _train_layouts(nproc: int, layouts: list, tmp_path: Path, dump: bool) -> dict:
    import tracer
    dumps = {name: ["--dump", str(tmp_path / f"{name}.json"), "--dump-grads"]
             if dump or not traced else [] for name, _, traced in layouts}
    spec = [(name, [*TINY, *flags, *dumps[name]], str(tmp_path / name) if traced else None)
            for name, flags, traced in layouts]
    spec_file = tmp_path / f"layouts-{nproc}-{layouts[0][0]}.json"
    spec_file.write_text(json.dumps(spec))
    if nproc == 1:
        proc = subprocess.run([sys.executable, "tests/scripts/train_layouts.py", str(spec_file)],
                              cwd=REPO, env=env(), capture_output=True, text=True, timeout=240)
    else:
        proc = launch(nproc, [str(spec_file)], script="tests/scripts/train_layouts.py")
    names = ", ".join(name for name, _, _ in layouts)
    assert proc.returncode == 0, f"{names} failed:\n{proc.stdout}\n{proc.stderr[-4000:]}"
    out = {}
    for name, _, traced in layouts:
        dumped = None
        if dumps[name]:
            dumped = read_dump(tmp_path / f"{name}.json")
            printed = tmp_path / f"{name}.stdout"
            dumped["stdout"] = printed.read_text() if printed.exists() else ""
        out[name] = dumped
        if traced:
            traces = [tracer.load(str(tmp_path / name / f"rank-{r}.arrow"))
                      for r in range(nproc)]
            out[name] = {"records": [t.records() for t in traces], "dump": dumped,
                         "config": traces[0].config}
    return out


def read_dump(path: Path) -> dict:
    """A --dump JSON with its --dump-grads arrays loaded into "grads"."""
    out = json.loads(Path(path).read_text())
    if out["grads"] is not None:
        with np.load(out["grads"]) as grads:
            out["grads"] = {key: grads[key] for key in grads.files}
    return out


def labels(record: dict) -> list[str]:
    """The labels of a record's annotations, outermost first."""
    return [a["label"] for a in record["annotation"]]
