"""What a traced run recorded, against what a dispatch mode of its own script counted under the
recorder (tests/scripts/compiled_counter.py), for the torch.compile and checkpointing tests.

The counter sees every op the recorder passes on, so the two agree op for op, but for what the
recorder records in another form, on purpose:

- record_function's enter and exit ops: a ``paratrace::annotation`` range each (its row is
  recorded when the range closes);
- gloo's reduce-scatter copies this rank's chunk out inside ``Work.wait`` (one ``aten.split``
  and one ``aten.copy_`` per reduce-scatter): the recorder leaves them to the collective it
  completes (tracer/recorder/comm.py, wait_hook); the counter, below it, sees them.

Op for op on the torch this project pins (2.13; 2.14.1 too). torch 2.9.1 and 2.6 dispatch the
``aten.detach`` with which autograd saves an op's output inside that op's own call: a mode below
the one running the op sees it, the recorder above does not (measured: 20 such detaches an
iteration of tests/scripts/phases_reentrant.py), and the comparison fails there on detach."""
from __future__ import annotations

from collections import Counter

RECORD_FUNCTION = ("profiler._record_function_enter_new.default",
                   "profiler._record_function_exit._RecordFunction")
COPY_OUT = ("aten.split.Tensor", "aten.copy_.default")


def recorded_ops(records) -> Counter:
    """The ops among ``records`` by name (not the recorder's own rows: ranges, steps)."""
    return Counter(e["op"] for e in records if not e["op"].startswith("paratrace::"))


def counted_ops(counted: dict) -> Counter:
    """The ops the counter saw run in one section, less what the recorder records otherwise."""
    ops = Counter({op: n for op, n in counted["ran"].items() if op not in RECORD_FUNCTION})
    for op in COPY_OUT:
        ops[op] -= counted["collectives"].get("reduce_scatter", 0)
    return +ops


def record_function_ranges(records) -> int:
    """record_function ranges among ``records``."""
    return sum(1 for e in records if e["op"] == "paratrace::annotation" and e["annotation"]
               and e["annotation"][-1].get("source") == "record_function")


def assert_collectives_match(records, counted: dict, where: str) -> None:
    """The recorded collectives, kind by kind, equal the counter's; those in backward phases
    (backward, grad_sync) equal the ones it saw launched while the autograd engine ran."""
    comm = [e for e in records if e["kind"]]
    assert Counter(e["kind"] for e in comm) == counted["collectives"], where
    assert Counter(e["kind"] for e in comm if e["phase"] in ("backward", "grad_sync")) == \
        counted["in_backward"], where


def region(e):
    """The torch.compile range an op ran in (its attributes), or None."""
    return next((a for a in e["annotation"] or () if a.get("source") == "torch.compile"), None)
