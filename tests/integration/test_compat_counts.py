"""The collectives a run records are the same on every supported torch: the same workloads run
under trace-run by this interpreter (a compatibility venv's torch, scripts/compat.sh) and by the
pinned torch's interpreter (PARATRACE_PINNED_PYTHON, which compat.sh sets), and each rank's
collectives (kind, phase, process group, bytes, count) must be equal. Without that variable
(the main suite, already on the pinned torch) there is nothing to compare against: skipped.
The pinned interpreter's counts are kept in PARATRACE_PINNED_CACHE, where set, for the next
venv's run (compat.sh runs three)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

import tracer
from support.gpt_helpers import free_port
from support.cli import ENV
from support.paths import REPO, SCRIPTS

PINNED = os.environ.get("PARATRACE_PINNED_PYTHON")
pytestmark = pytest.mark.skipif(
    not PINNED or os.path.realpath(PINNED) == os.path.realpath(sys.executable),
    reason="needs another interpreter with the pinned torch (scripts/compat.sh sets "
           "PARATRACE_PINNED_PYTHON)")

GPT = ["-m", "sample_runs.train", "--layers", "2", "--hidden", "32", "--heads", "4",
       "--seq-len", "16", "--micro-batch-size", "2", "--steps", "2", "--seed", "3"]
WORKLOADS = {
    # tensor + sequence parallelism, ZeRO-1 over nothing: every TP/SP collective per layer
    "gpt-tp2-sp": GPT + ["--tp", "2", "--sp", "--pp", "1", "--microbatches", "2"],
    # a 1F1B pipeline: the P2P sends and receives per micro-batch
    "gpt-pp2-1f1b": GPT + ["--tp", "1", "--pp", "2", "--schedule", "1f1b",
                           "--microbatches", "4"],
    # data parallelism with ZeRO-2: reduce-scatters and all-gathers of the flat buffers
    "gpt-dp2-zero2": GPT + ["--tp", "1", "--pp", "1", "--dp", "2", "--zero", "2",
                            "--microbatches", "2"],
    # DDP, FSDP2, checkpointing, closures, collectives by hand (test_phases_apis's script)
    "apis": [str(SCRIPTS / "phases_apis.py")],
}


def collectives(python: str, workload: str, out: Path) -> dict:
    """rank -> Counter of (kind, phase, group, bytes) of a 2-rank run of ``workload`` launched
    by ``python``: the reference GPT under its trace-run, the API script (which records itself)
    under its torchrun."""
    args = WORKLOADS[workload]
    if workload == "apis":
        launcher = ["torch.distributed.run", "--master-addr", "127.0.0.1", "--master-port",
                    str(free_port())]
        args, traces = [*args, str(out)], out
    else:
        launcher = ["instrument.launch", "--no-report", "--out", str(out)]
        traces = out / "traces"
    command = [python, "-m", *launcher, "--nproc-per-node", "2", *args]
    env = dict(ENV, PYTHONPATH=str(REPO))
    proc = subprocess.run(command, cwd=REPO, env=env, text=True, capture_output=True,
                          timeout=300)
    assert proc.returncode == 0, f"{python}: {workload}: {proc.stderr[-3000:]}"
    return {rank: Counter((e["kind"], e["phase"], tuple(e["group"] or ()), e["bytes"])
                          for e in tracer.load(traces / f"rank-{rank}.arrow").records()
                          if e["kind"])
            for rank in range(2)}


def pinned_collectives(workload: str, out: Path) -> dict:
    """:func:`collectives` of the pinned interpreter, from the cache where it holds them."""
    cache = os.environ.get("PARATRACE_PINNED_CACHE")
    path = Path(cache) / f"{workload}.json" if cache else None
    if path is not None and path.exists():
        return {int(rank): Counter({(kind, phase, tuple(group), nbytes): count
                                    for kind, phase, group, nbytes, count in rows})
                for rank, rows in json.loads(path.read_text()).items()}
    counts = collectives(PINNED, workload, out)
    if path is not None:
        path.write_text(json.dumps({rank: [[*key, n] for key, n in c.items()]
                                    for rank, c in counts.items()}))
    return counts


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_collectives_equal_the_pinned_torchs(workload, tmp_path):
    mine = collectives(sys.executable, workload, tmp_path / "this")
    pinned = pinned_collectives(workload, tmp_path / "pinned")
    assert sum(sum(c.values()) for c in pinned.values()) > 0
    for rank in range(2):
        assert mine[rank] == pinned[rank], \
            f"rank {rank}: only here {mine[rank] - pinned[rank]}, only pinned " \
            f"{pinned[rank] - mine[rank]}"
