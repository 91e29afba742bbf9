"""FSDP2's collectives belong to the module whose parameters they move, even when FSDP issues
them early (tests/scripts/fsdp_modules.py, 2 ranks, gloo): a Sequential of 4 blocks of distinct
widths under fully_shard per block and on the root, with FSDP's implicit backward prefetching,
then with explicit forward and backward prefetching. Each all-gather's bytes are a block's
shard, computed here from the widths (FSDP2 shards every parameter's first dimension in equal,
padded chunks); torch's CommDebugMode counts the collectives in the same run. docs/phases.md
says what FSDP2 records."""
from __future__ import annotations

import json
from collections import Counter

import pytest

import tracer
from support.gpt_helpers import torchrun

WORLD = 2
WIDTHS = (8, 12, 16, 20, 24)     # tests/scripts/fsdp_modules.py's
OUTPUTS = 2
BLOCKS = len(WIDTHS) - 1
ROOT = "FSDPSequential"          # fully_shard renames a module's class FSDP<class>
SECTIONS = ("implicit", "explicit")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp")
    torchrun("fsdp_modules.py", out)
    return {r: (tracer.load(out / f"rank-{r}.arrow").records(),
                json.loads((out / f"comm-debug-{r}.json").read_text())) for r in range(WORLD)}


def shard_bytes(inputs: int, outputs: int) -> int:
    """One rank's shard of a Linear(inputs, outputs) in float32: weight (outputs, inputs) and
    bias (outputs), each cut along its first dimension into WORLD chunks padded to equal size."""
    rows = -(-outputs // WORLD)
    return (rows * inputs + rows) * 4


# the module each shard size belongs to (the widths make every one distinct)
OWNER = {shard_bytes(WIDTHS[i], WIDTHS[i + 1]): f"{ROOT}.{i}" for i in range(BLOCKS)}
OWNER[shard_bytes(WIDTHS[-1], OUTPUTS)] = ROOT


def rows(records, section: str, kind: str, phase: str) -> list:
    return [e for e in records if e["kind"] == kind and e["phase"] == phase
            and e["annotation"] and e["annotation"][0]["label"] == section]


def prefetches(event) -> list:
    return [a for a in event["annotation"] if a["label"] == "fsdp.prefetch"]


def test_the_widths_give_every_module_its_own_shard_size():
    assert len(OWNER) == BLOCKS + 1


def test_fsdp_collectives_are_as_many_as_torch_counts(run):
    for records, debug in run.values():
        for section in SECTIONS:
            ops = [e for e in records if e["kind"] and e["annotation"]
                   and e["annotation"][0]["label"] == section]
            got = Counter((e["kind"], e["phase"]) for e in ops)
            assert got == {("all_gather", "forward"): BLOCKS + 1,
                           ("all_gather", "backward"): BLOCKS,
                           ("reduce_scatter", "grad_sync"): BLOCKS + 1}, section
            assert debug[section] == {"_allgather_base_": 2 * BLOCKS + 1,
                                      "_reduce_scatter_base_": BLOCKS + 1}


def test_each_all_gather_belongs_to_the_module_whose_shard_it_moves(run):
    for records, _ in run.values():
        for section in SECTIONS:
            for phase, count in (("forward", BLOCKS + 1), ("backward", BLOCKS)):
                gathers = rows(records, section, "all_gather", phase)
                assert len(gathers) == count
                for e in gathers:
                    assert e["module"] == OWNER[e["bytes"]], (section, phase, e["bytes"])
            # backward: every block once, in reverse order; the root keeps its parameters
            assert [e["module"] for e in rows(records, section, "all_gather", "backward")] \
                == [f"{ROOT}.{i}" for i in reversed(range(BLOCKS))]


def test_each_reduce_scatter_belongs_to_the_module_whose_gradients_it_reduces(run):
    for records, _ in run.values():
        for section in SECTIONS:
            scatters = rows(records, section, "reduce_scatter", "grad_sync")
            # a reduce-scatter's bytes: the whole padded gradient, WORLD shards
            assert Counter(e["module"] for e in scatters) == Counter(OWNER.values())
            for e in scatters:
                assert e["module"] == OWNER[e["bytes"] // WORLD]
                assert e["bytes"] % WORLD == 0


def test_a_prefetch_says_which_module_issued_it(run):
    # backward runs the blocks in reverse: block i's parameters are gathered early by the
    # module whose backward runs just before (block i + 1; the root for the last block)
    by_backward = {f"{ROOT}.{i}": f"{ROOT}.{i + 1}" if i + 1 < BLOCKS else ROOT
                   for i in range(BLOCKS)}
    # explicit forward prefetching: block i gathers block i + 1's parameters in its pre-hook
    by_forward = {"implicit": {},
                  "explicit": {f"{ROOT}.{i + 1}": f"{ROOT}.{i}" for i in range(BLOCKS - 1)}}
    for records, _ in run.values():
        for section in SECTIONS:
            for phase, expected in (("backward", by_backward), ("forward", by_forward[section])):
                got = {}
                for e in rows(records, section, "all_gather", phase):
                    found = prefetches(e)
                    assert len(found) <= 1
                    if found:
                        assert (found[0]["module"], found[0]["pass"], found[0]["source"]) \
                            == (e["module"], phase, "fsdp")
                        got[e["module"]] = found[0]["by"]
                assert got == expected, (section, phase)
            # each prefetch is a recorded range around its all-gather
            ranges = [e for e in records if e["op"] == "paratrace::annotation"
                      and e["annotation"][0]["label"] == section
                      and e["annotation"][-1]["label"] == "fsdp.prefetch"]
            assert len(ranges) == BLOCKS + len(by_forward[section])
            for e in rows(records, section, "all_gather", "backward"):
                (outer,) = [r for r in ranges if r["annotation"][-1] == prefetches(e)[0]]
                assert outer["t0"] <= e["t0"] <= outer["t1"]


def test_a_backward_collective_keeps_the_forward_stack_of_its_module(run):
    """Not the stack of the downstream op whose autograd node ran FSDP's hook: where the
    module's parameters were gathered for its forward (the module's call)."""
    for records, _ in run.values():
        for section in SECTIONS:
            forward = {e["module"]: e["stack"] for e in rows(records, section, "all_gather",
                                                             "forward")}
            later = rows(records, section, "all_gather", "backward") + \
                rows(records, section, "reduce_scatter", "grad_sync")
            for e in later:
                assert e["fwd_stack"] and e["fwd_stack"] == forward[e["module"]], e["module"]
