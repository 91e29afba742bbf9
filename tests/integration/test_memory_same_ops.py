"""Memory recording changes nothing else in a recording (issue 51, item 1): the same runs traced
with and without memory (``--memory``, the default, and ``--no-memory``) record the same ops,
in the same phases, on the same modules.

Two runs of each, 2 gloo ranks on the CPU: the reference GPT (tiny, data parallel) and a script
with DDP, FSDP2 and non-reentrant activation checkpointing (tests/scripts/memory_same_ops.py).
The run without memory is the independent count for the run with it; for the script, a dispatch
mode of its own under the recorder also counts what torch ran in each section, in both runs.
Before the fix, memory recording's saved_tensors_hooks made autograd dispatch other
``aten.detach`` calls through the recording mode (in backward for every saved tensor, none in
forward for saved outputs): every phase's detach count moved. No wall-clock assertions."""
from __future__ import annotations

import json
from collections import Counter

import pytest

import tracer
from support.cli import trace_run
from support.counted_ops import counted_ops, recorded_ops
from support.gpt_helpers import TINY
from support.paths import SCRIPTS
from tracer.files import rundir
from viz.analysis.rank import op_counts_by_phase

pytestmark = pytest.mark.integration

GPT = ["-m", "sample_runs.train", "--tp", "1", "--pp", "1", "--dp", "2", *TINY]
SCRIPT = ("ddp", "fsdp2", "checkpoint")


def _record(out, memory: bool, *target) -> list:
    """trace-run (``--memory``, the default, or ``--no-memory``) of ``target`` on 2 ranks:
    each rank's trace."""
    proc = trace_run("--memory" if memory else "--no-memory", "--nproc-per-node", "2", "--out",
                     out, "--no-report", *target, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [tracer.load(rundir.trace_file(str(out / "traces"), r)) for r in range(2)]


def _by_module(trace) -> Counter:
    return Counter((e["op"], e["phase"], e["module"]) for e in trace.records()
                   if not e["op"].startswith("paratrace::"))


def _assert_same_recording(plain: list, with_memory: list) -> None:
    for rank, (a, b) in enumerate(zip(plain, with_memory)):
        assert a.memory is None and b.memory is not None and len(b.memory), rank
        assert op_counts_by_phase(b) == op_counts_by_phase(a), rank
        assert _by_module(b) == _by_module(a), rank


def test_the_reference_gpt_records_the_same_ops_with_memory(tmp_path):
    _assert_same_recording(_record(tmp_path / "plain", False, *GPT),
                           _record(tmp_path / "memory", True, *GPT))


def _section(trace, label: str, i: int) -> list:
    return [e for e in trace.records()
            if any(a["label"] == label and a.get("iteration") == i for a in e["annotation"])]


def test_ddp_fsdp2_and_checkpointing_record_the_same_ops_with_memory(tmp_path):
    runs = {}
    for memory in (False, True):
        out = tmp_path / ("memory" if memory else "plain")
        out.mkdir()
        traces = _record(out / "run", memory, SCRIPTS / "memory_same_ops.py", out)
        counts = [json.loads((out / f"counts-{r}.json").read_text()) for r in range(2)]
        runs[memory] = traces, counts
    _assert_same_recording(runs[False][0], runs[True][0])
    for rank in range(2):
        for label in SCRIPT:
            for i in range(2):
                where = (rank, label, i)
                ran = [counted_ops(runs[m][1][rank][f"{label}/{i}"]) for m in (False, True)]
                # the script's own count: torch ran the same ops with memory recorded
                assert ran[0] == ran[1], where
                # and the recorder wrote what ran, no more (its own work is no op of the run);
                # not FSDP2's: its optimizer steps DTensors, which the recorder writes as ranges
                # holding their local ops and the counter below sees dispatched again
                for memory in (False, True):
                    if label != "fsdp2":
                        assert recorded_ops(_section(runs[memory][0][rank], label, i)) == \
                            ran[memory], (where, memory)
    # what the checkpointed blocks saved is found all the same: the blocks' inputs (each a
    # 4 x 8 float32, saved by the checkpoint to recompute from) are activations
    activations = runs[True][0][0].memory
    assert (activations.category == 2).any()
