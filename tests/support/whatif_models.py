"""The real runs trace-whatif's predictions on any model are checked against
(tests/integration/test_whatif_models.py): tests/scripts/whatif_train.py under trace-run with
memory, and what each real run did in its last counted step, read from its own traces:
every rank's communications as summary.json's comm rows (their dimensions from the run's own
analysis), and each rank's memory peak by category (viz.analysis.memory, a module the
predictions do not use)."""
from __future__ import annotations

from collections import Counter

import tracer
from support.cli import trace_run
from support.paths import SCRIPTS
from tracer.files import rundir
from tracer.vocab.groups import group_ranks
from tracer.vocab.labels import PHASES
from viz.analysis import analyse
from viz.run import open_run

TRAIN = SCRIPTS / "whatif_train.py"
STEPS = "3"


def record(out, args: list, ranks: int = 2, memory: bool = True) -> None:
    """trace-run of whatif_train.py with ``args`` into ``out``."""
    proc = trace_run(*(["--memory"] if memory else []), "--nproc-per-node", str(ranks),
                     "--out", out, "--no-report", TRAIN, "--steps", STEPS, *args,
                     timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]


def real_step(run_dir) -> dict:
    """rank (str) -> {"comm": rows of its last counted step, "memory": its peak}."""
    analysis = analyse(open_run(str(run_dir)))
    dims = {text: g.dimension for text, g in analysis.group_dimensions.items()}
    out = {}
    for rank, mine in analysis.ranks.items():
        last = max(mine.counted_steps)
        trace = tracer.load(rundir.trace_file(str(run_dir / "traces"), rank))
        kinds, groups = trace.dictionary("kind"), trace.dictionary("group")
        counts, sizes = Counter(), Counter()
        for kind, phase, step, group, nbytes in zip(
                trace.col("kind").tolist(), trace.col("phase").tolist(),
                trace.col("step").tolist(), trace.col("group").tolist(),
                trace.col("bytes").tolist()):
            if kind >= 0 and step == last:
                key = (kinds[kind], PHASES[phase], groups[group])
                counts[key] += 1
                sizes[key] += nbytes
        rows = sorted((kind, phase, tuple(group_ranks(group)), dims.get(group, "other"),
                       counts[(kind, phase, group)], sizes[(kind, phase, group)])
                      for kind, phase, group in counts)
        memory = mine.memory
        out[str(rank)] = {"comm": rows, "memory": None if memory is None else {
            "peak_bytes": memory.peak_bytes, "by_category": dict(memory.at_peak["category"])}}
    return out


def predicted_rows(rows: list) -> list:
    """whatif.json's collectives rows of a rank, as :func:`real_step` gives the real ones."""
    return sorted((r["kind"], r["phase"], tuple(r["group"]), r["dimension"], r["count"],
                   r["bytes"]) for r in rows)


def memory_misses(predicted: dict, real: dict, within: float) -> list:
    """Where a predicted peak misses the real one by more than ``within`` of the real peak:
    the peak itself, or a category."""
    peak = real["peak_bytes"]
    misses = []
    if abs(predicted["peak_bytes"] - peak) > within * peak:
        misses.append(f"peak {predicted['peak_bytes']} vs {peak}")
    for category in set(real["by_category"]) | set(predicted["by_category"]):
        a = predicted["by_category"].get(category, 0)
        b = real["by_category"].get(category, 0)
        if abs(a - b) > within * peak:
            misses.append(f"{category} {a} vs {b}")
    return misses
