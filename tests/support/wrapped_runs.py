"""One tiny GPT (tests/scripts/tiny_gpt_train.py) traced twice, under DDP and under FSDP2 (2
ranks, gloo, 3 steps, --memory), each from a script of its own (two copies of the file:
``ddp_train.py``, ``fsdp2_train.py``), as a new user compares them; conftest.py makes them a
session fixture for trace-diff's and the Perfetto export's tests."""
from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from support import cli
from support.gpt_helpers import free_port
from support.paths import SCRIPTS

SCRIPT = SCRIPTS / "tiny_gpt_train.py"
STEPS, RANKS = 3, 2
WRAPS = ("ddp", "fsdp2")


def record_wrapped(root: Path) -> dict:
    """wrap -> the run directory (traces, run.json; no report) of each wrap."""
    for name in WRAPS:
        shutil.copy(SCRIPT, root / f"{name}_train.py")

    def record(name: str) -> str:
        proc = cli.trace_run("--nproc-per-node", RANKS, "--master-port", free_port(),
                             "--memory", "--no-report", "--out", root / name,
                             root / f"{name}_train.py", "--wrap", name, "--steps", STEPS,
                             timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return str(root / name)
    with ThreadPoolExecutor(len(WRAPS)) as pool:
        return dict(zip(WRAPS, pool.map(record, WRAPS)))
