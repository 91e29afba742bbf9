"""torch.distributed.pipelining under the tracer, recorded in one 2-rank gloo launch
(tests/scripts/phases_pipelining.py): GPipe, 1F1B, interleaved 1F1B (2 stages per rank),
interleaved zero bubble (1 stage per rank: ZB-H1) and ZB-V, 4 micro-batches each, one per step,
with a torch.randn outside the schedule; rank 0 imports pipelining before the trace starts, rank
1 inside it (the recorder patches it then). Passes and micro-batches come from the schedule's own
calls (tracer/recorder/frameworks/pipelining.py), P2P phases from the messages (activations forward,
gradients backward), and the analysis's theoretical bubble from the schedule recorded in each step
(docs/phases.md, docs/metrics.md)."""
from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

import tracer
from support.gpt_helpers import torchrun
from tracer.vocab.labels import PHASE_GRAD_SYNC, pass_of, phase_of_label, schedule_of
from viz.analysis import analyse
from viz.run import open_run

M, P = 4, 2
ALL_STEPS = {"gpipe": 1, "1f1b": 2, "interleaved": 3, "zero-bubble": 4, "zbv": 5}


def unrunnable() -> tuple:
    """The schedules this torch's own pipelining cannot run on gloo (the zero-bubble ones
    before torch rewrote its P2P handshake in 2.13: docs/compat.md); the script leaves their
    steps empty."""
    from torch.distributed.pipelining.schedules import PipelineScheduleMulti
    return () if hasattr(PipelineScheduleMulti, "_initialize_pp_stages") \
        else ("zero-bubble", "zbv")


STEP = {name: step for name, step in ALL_STEPS.items() if name not in unrunnable()}
# the global stages each rank holds
STAGES = {"gpipe": {0: [0], 1: [1]}, "1f1b": {0: [0], 1: [1]},
          "interleaved": {0: [0, 2], 1: [1, 3]}, "zero-bubble": {0: [0], 1: [1]},
          "zbv": {0: [0, 3], 1: [1, 2]}}
PASS_LABELS = ("F", "B", "W")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("pipelining")
    torchrun("phases_pipelining.py", out)
    traces = {r: tracer.load(out / f"rank-{r}.arrow") for r in range(P)}
    return {"traces": traces, "records": {r: t.records() for r, t in traces.items()},
            "plans": {r: json.loads((out / f"plans-{r}.json").read_text()) for r in range(P)},
            "restored": {r: json.loads((out / f"restored-{r}.json").read_text())
                         for r in range(P)},
            "analysis": analyse(open_run(out))}


def passes(analysis, rank: int, name: str) -> list:
    return [p for p in analysis.timeline.ranks[rank].passes if p.step == STEP[name]]


def in_pass(event) -> bool:
    return any(a["label"] in PASS_LABELS for a in event["annotation"])


def test_every_schedule_runs_the_passes_it_planned_with_its_microbatch_numbers(run):
    for rank in range(P):
        assert sorted(run["plans"][rank]) == sorted(STEP)     # what the script ran
        for name, step in STEP.items():
            found = passes(run["analysis"], rank, name)
            assert {p.source for p in found} == {"schedule"}
            got = [(p.kind, p.microbatch, p.chunk) for p in found]
            # torch's own plan for this rank (pipeline_order), in the order it ran; torch
            # 2.13's plan for 1F1B numbers the last rank's forwards 1..4 (there is no 4), while
            # its _step_microbatches runs 0..3: 1F1B is checked against docs/oracles.md below
            plan = run["plans"][rank][name]
            assert plan, name
            if name != "1f1b":
                assert got == [tuple(a) for a in plan], name
            kinds = ("F", "B", "W") if name in ("zero-bubble", "zbv") else ("F", "B")
            assert Counter((k, s) for k, _, s in got) == {
                (k, s): M for k in kinds for s in STAGES[name][rank]}
            for kind in kinds:
                for stage in STAGES[name][rank]:
                    assert sorted(mb for k, mb, s in got if (k, s) == (kind, stage)) \
                        == list(range(M))
    # GPipe and 1F1B spelled out (docs/oracles.md's 1F1B order, p=2, m=4)
    order = {r: [(p.kind, p.microbatch) for p in passes(run["analysis"], r, "1f1b")]
             for r in range(P)}
    assert order[0] == [("F", 0), ("F", 1), ("B", 0), ("F", 2), ("B", 1), ("F", 3), ("B", 2),
                        ("B", 3)]
    assert order[1] == [(k, i) for i in range(M) for k in ("F", "B")]
    for r in range(P):
        assert [(p.kind, p.microbatch, p.chunk) for p in passes(run["analysis"], r, "gpipe")] \
            == [(k, i, r) for k in ("F", "B") for i in range(M)]


def test_ops_outside_the_schedule_are_in_no_pass(run):
    for records in run["records"].values():
        randn = [e for e in records if e["op"] == "aten.randn.default" and e["step"] in
                 STEP.values()]
        assert len(randn) == 3 * len(STEP)          # noise, x, target in every step
        assert not any(in_pass(e) for e in randn)
        # data: grad mode on, outside modules, but autograd records nothing: not the forward
        assert {e["phase"] for e in randn} == {"other"}


def p2p_expected(name: str, rank: int) -> Counter:
    """Sends and recvs of one rank by phase, from where its stages' neighbours live: an
    activation goes to stage s+1, a gradient to stage s-1; m of each per boundary."""
    where = {s: r for r, stages in STAGES[name].items() for s in stages}
    out = Counter()
    for s in STAGES[name][rank]:
        if s + 1 in where and where[s + 1] != rank:
            out[("send", "forward")] += M
            out[("recv", "backward")] += M
        if s - 1 in where and where[s - 1] != rank:
            out[("recv", "forward")] += M
            out[("send", "backward")] += M
    return out


def test_activations_travel_in_forward_and_gradients_in_backward(run):
    for rank, records in run["records"].items():
        for name, step in STEP.items():
            p2p = [e for e in records if e["step"] == step and e["kind"] in ("send", "recv")]
            counts = Counter((e["kind"], e["phase"]) for e in p2p if e["phase"] != "other")
            assert counts == p2p_expected(name, rank), name
            # the rest is the schedule's first-step setup (P2P warm-up, shape inference),
            # before its first pass
            first = min(e["t0"] for e in records if e["step"] == step and in_pass(e))
            setup = [e for e in p2p if e["phase"] == "other"]
            assert setup and all(e["t0"] < first for e in setup)
    # each send has the phase of the recv that consumed it (k-th send a->b, k-th recv on b)
    for a, b in ((0, 1), (1, 0)):
        sent = [e["phase"] for e in run["records"][a] if e["kind"] == "send" and e["peer"] == b]
        got = [e["phase"] for e in run["records"][b] if e["kind"] == "recv" and e["peer"] == a]
        # (8 M over the five schedules; in proportion where this torch runs fewer)
        assert sent == got and len(sent) > 8 * M * len(STEP) / len(ALL_STEPS)


def test_gradient_steps_of_the_schedule_are_told_apart(run):
    for rank, records in run["records"].items():
        for name, step in STEP.items():
            ops = [e for e in records if e["step"] == step and e["op"] != "paratrace::annotation"
                   and not e["kind"]]
            # the scaling by 1/m after the last backward: grad_sync (weight and bias per stage)
            sync = [e for e in ops if e["phase"] == "grad_sync"]
            assert Counter(e["op"] for e in sync) == {
                "aten.div_.Tensor": 2 * len(STAGES[name][rank])}
            assert all(e["annotation"][-1]["label"] == "pipelining.reduce_grad" for e in sync)
            for e in ops:
                labels = {a["label"] for a in e["annotation"]}
                if labels & {"B", "W"}:       # the accumulation of gradients too (add_)
                    assert e["phase"] == "backward", (name, e["op"])
                elif "F" in labels:
                    assert e["phase"] == "forward", (name, e["op"])
            adds = [e for e in ops if e["op"] == "aten.add_.Tensor" and in_pass(e)]
            assert adds and {e["phase"] for e in adds} == {"backward"}


def test_the_loss_is_part_of_the_last_stage_forward_pass(run):
    for rank, records in run["records"].items():
        for name, step in STEP.items():
            last = 2 * P - 1 if len(STAGES[name][rank]) > 1 else P - 1
            ranges = {(e["annotation"][-1]["microbatch"], bool(e["annotation"][-1].get("loss"))): e
                      for e in records if e["step"] == step and e["op"] == "paratrace::annotation"
                      and e["annotation"][-1]["label"] == "F"
                      and e["annotation"][-1]["stage"] == last}
            if last not in STAGES[name][rank]:
                assert not ranges
                continue
            f = {p.microbatch: p for p in passes(run["analysis"], rank, name)
                 if p.kind == "F" and p.chunk == last}
            assert len(ranges) == 2 * M and len(f) == M
            for mb, p in f.items():
                forward, loss = ranges[(mb, False)], ranges[(mb, True)]
                assert forward["t1"] <= loss["t0"]            # the loss comes after the forward
                # one pass from the forward's start to the loss's end (on rank 0's clock)
                offset = run["traces"][rank].clock_offset
                assert (p.start, p.end) == (forward["t0"] + int(offset(forward["t0"])),
                                            loss["t1"] + int(offset(loss["t1"])))
                losses = [e for e in records if e["op"] == "aten.mean.default"
                          and forward["t0"] <= e["t0"] <= loss["t1"]]
                assert len(losses) == 1 and losses[0]["phase"] == "forward"


def pass_times(analysis, step: int) -> dict:
    """Mean compute seconds per pass kind over both ranks in one step (computed here from the
    lanes, as docs/metrics.md defines it)."""
    out: dict = {}
    for lane in analysis.timeline.ranks.values():
        k = lane.compute
        for p in lane.passes:
            if p.step != step:
                continue
            busy = np.clip(np.minimum(k[:, 1], p.end) - np.maximum(k[:, 0], p.start), 0, None)
            out.setdefault(p.kind, []).append(busy.sum() / 1e9)
    return {kind: sum(v) / len(v) for kind, v in out.items()}


def test_the_analysis_gives_each_schedule_its_theoretical_bubble(run):
    analysis = run["analysis"]
    theory = {"gpipe": (P - 1) / (M + P - 1), "1f1b": (P - 1) / (M + P - 1),
              "interleaved": (P - 1) / (2 * M) / (1 + (P - 1) / (2 * M)),
              "zbv": None}                   # no formula for ZB-V (docs/metrics.md)
    if "zero-bubble" in STEP:
        t = pass_times(analysis, STEP["zero-bubble"])
        zb = (P - 1) * max(t["F"] + t["B"] - t["W"], 0)
        theory["zero-bubble"] = zb / (zb + M * (t["F"] + t["B"] + t["W"]))
    assert theory["interleaved"] == pytest.approx(1 / 9)
    for rank in range(P):
        lane = analysis.timeline.ranks[rank]
        assert lane.schedules == {
            step: schedule for step, schedule in {
                1: ("gpipe", 2, 4, 1), 2: ("1f1b", 2, 4, 1), 3: ("interleaved", 2, 4, 2),
                4: ("zb-h1", 2, 4, 1), 5: ("zb-v", 2, 4, 2)}.items()
            if step in STEP.values()}
        steps = {s.step: s for s in analysis.metrics[rank].steps}
        for name, step in STEP.items():
            pipe = steps[step].pipeline
            assert pipe is not None, name
            if theory[name] is None:
                assert pipe.theoretical_bubble_fraction is None
            else:
                assert pipe.theoretical_bubble_fraction == pytest.approx(theory[name], rel=1e-9)
            # the passes form a schedule across both ranks: the replay runs them all
            assert pipe.simulated_bubble_fraction is not None, name
        assert steps[0].pipeline is None        # setup: no schedule ran
        # the run's: the counted steps' weighted by their windows; null here, as ZB-V has none
        m = analysis.metrics[rank]
        pipes = [steps[s].pipeline for s in m.counted_steps if steps[s].pipeline is not None]
        have = [p for p in pipes if p.theoretical_bubble_fraction is not None]
        assert len(pipes) == len(STEP)
        assert len(have) == sum(theory[name] is not None for name in STEP)
        assert m.pipeline.theoretical_bubble_fraction == pytest.approx(
            sum(p.theoretical_bubble_fraction * p.window_s for p in have)
            / sum(p.window_s for p in have))
        if any(theory[name] is None for name in STEP):    # ZB-V's has none: nor the run's
            assert m.theoretical_bubble_fraction is None
        assert all(s.pipeline is None for k, s in steps.items() if k not in STEP.values())


def test_the_tracer_puts_torch_back_after_the_trace(run):
    assert run["restored"] == {0: [], 1: []}


def test_labels_name_pipelining_passes_schedules_and_gradient_steps():
    found = pass_of("F", {"microbatch": 2, "stage": 3, "source": "pipelining", "loss": True})
    assert (found.kind, found.microbatch, found.chunk, found.source, found.loss) \
        == ("F", 2, 3, "schedule", True)
    assert pass_of("F", {"microbatch": 2, "chunk": 1}).source == "annotation"
    assert pass_of("PP:1I3", {}).kind == "B" and pass_of("PP:0REDUCE_GRAD", {}) is None
    assert phase_of_label("PP:0REDUCE_GRAD") == PHASE_GRAD_SYNC
    attrs = {"schedule": "1f1b", "pp": 2, "microbatches": 4, "virtual_stages": 1}
    assert schedule_of("pipelining.step", attrs) == ("1f1b", 2, 4, 1)
    assert schedule_of("pipelining.step", dict(attrs, backward=False)) is None   # eval()
    assert schedule_of("other", attrs) is None
