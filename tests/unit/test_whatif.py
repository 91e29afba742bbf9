"""What-if predictions on constructed recordings with known times: exact values.

The recordings (tests/support/whatif_helpers.py) are pipeline runs with one op per layer per pass,
no host time and free or fixed-latency P2P, so every expected number comes from the papers'
formulas (docs/oracles.md) or a count written out in the test.
"""
from __future__ import annotations

import pytest

from viz.analysis import analyse
from viz.run import open_run
from viz.whatif import TargetError, what_if
from support.whatif_helpers import U, pipeline_run
from support.paths import GPU_FIXTURE


def whatif(tmp_path, targets, **run):
    pipeline_run(tmp_path / "run", **run)
    return what_if(analyse(open_run(str(tmp_path / "run"))), targets)


def units(seconds: float) -> float:
    return seconds * 1e9 / U


def test_replay_reproduces_the_constructed_step(tmp_path):
    """1F1B, p=2, m=4, a layer 10 units forward, 20 backward, 2 layers a stage: the schedule's
    period is the makespan m(T_F+T_B) + (p-1)(T_F+T_B) = 4*60 + 60 = 300 units, and the replay
    gives exactly the measured step and bubble on every rank."""
    result = whatif(tmp_path, [])
    assert units(result.measured["step_s"]) == pytest.approx(300)
    assert units(result.replayed["step_s"]) == pytest.approx(300)
    for rank in ("0", "1"):
        measured, replayed = result.measured["ranks"][rank], result.replayed["ranks"][rank]
        assert replayed["step_s"] == pytest.approx(measured["step_s"])
        assert replayed["bubble_fraction"] == pytest.approx(measured["bubble_fraction"])
        assert replayed["bubble_fraction"] == pytest.approx(1 / 5)     # (p-1)/(m+p-1)


def test_replay_reproduces_a_step_with_p2p_latency(tmp_path):
    """Latency 7 units on each message: the replay still gives the measured step exactly."""
    result = whatif(tmp_path, [], latency=7)
    assert result.replayed["step_s"] == pytest.approx(result.measured["step_s"])
    assert result.replayed["exposed_comm_s"] == pytest.approx(result.measured["exposed_comm_s"])


@pytest.mark.parametrize("p,m,v", [(2, 4, 2), (2, 8, 2), (4, 8, 2)])
def test_uniform_passes_under_interleaving_give_the_papers_bubble(tmp_path, p, m, v):
    """Recorded 1F1B with free P2P; predicted interleaved with v chunks: the layers re-split
    into v chunks a rank, each pass 1/v of the time; bubble (p-1)/(v*m+p-1)."""
    result = whatif(tmp_path, [{"schedule": "interleaved", "virtual_stages": v,
                                "microbatches": m}], p=p, m=4, layers=p * v)
    predicted = result.targets[0].measures
    expected = (p - 1) / (v * m + p - 1)
    assert predicted["bubble_fraction"] == pytest.approx(expected)
    for rank in predicted["ranks"].values():
        assert rank["bubble_fraction"] == pytest.approx(expected)
    # a rank holds v of the p*v layers: m micro-batches of v*(10+20) units per step, the rest
    # of the period is the bubble
    busy = m * v * (10 + 20)
    assert units(predicted["step_s"]) == pytest.approx(busy / (1 - expected))


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_microbatch_and_schedule_changes_give_the_papers_bubble(tmp_path, schedule):
    """Passes repeat with their measured times: m=8 on p=2 gives (p-1)/(m+p-1) = 1/9 and a
    period of (m+p-1)(T_F+T_B) = 9 * 60 units."""
    result = whatif(tmp_path, [{"microbatches": 8, "schedule": schedule}])
    predicted = result.targets[0].measures
    assert predicted["bubble_fraction"] == pytest.approx(1 / 9)
    assert units(predicted["step_s"]) == pytest.approx(9 * 60)


def test_pipeline_degree_re_splits_the_layers(tmp_path):
    """p=2 -> p=1 with dp 2 (the world stays 2): each rank runs all 4 layers, 4 micro-batches
    of (4*10 + 4*20) units, nothing to wait for (no collective recorded: the buckets' all-reduce
    comes from the free link) -> a step of 480 units, no bubble."""
    result = whatif(tmp_path, [{"pp": 1}])
    target = result.targets[0]
    assert target.config["dp"] == 2 and target.config["pp"] == 1
    assert units(target.measures["step_s"]) == pytest.approx(4 * (40 + 80))
    assert target.measures["bubble_fraction"] == pytest.approx(0)
    assert sorted(target.measures["ranks"]) == ["0", "1"]


def test_pipeline_deepening_follows_the_schedule(tmp_path):
    """p=2 -> p=4 (dp named: a world of 4): a stage holds one layer (10 + 20 units), 1F1B with
    m=4 -> period (m+p-1)*30 = 210 units, bubble 3/7."""
    result = whatif(tmp_path, [{"pp": 4, "dp": 1}])
    predicted = result.targets[0].measures
    assert units(predicted["step_s"]) == pytest.approx(7 * 30)
    assert predicted["bubble_fraction"] == pytest.approx(3 / 7)


@pytest.mark.parametrize("changes,message", [
    ({"pp": 4}, "world size 2 is not a multiple of tp 1 x pp 4"),
    ({"pp": 3, "dp": 1}, "layers 4 is not divisible by pp x virtual stages = 3"),
    ({"tp": 3, "pp": 1, "dp": 1}, "--tp 3 does not divide heads 4"),
    ({"schedule": "interleaved"}, "--schedule interleaved needs --virtual-stages >= 2"),
    ({"schedule": "interleaved", "virtual_stages": 2, "microbatches": 3},
     "--microbatches divisible by --pp"),
    ({"virtual_stages": 2}, "--virtual-stages 2 needs --schedule interleaved"),
])
def test_impossible_targets_are_refused_in_one_line(tmp_path, changes, message):
    pipeline_run(tmp_path / "run")
    analysis = analyse(open_run(str(tmp_path / "run")))
    with pytest.raises(TargetError) as err:
        what_if(analysis, [changes])
    assert message in str(err.value) and "\n" not in str(err.value)


def test_tensor_degree_scales_compute_by_flops_and_adds_megatron_collectives(tmp_path):
    """tp 1 -> 2 (dp named: a world of 4): every op is a column-parallel matmul whose time is
    proportional to its FLOPs, so each pass takes half as long: period (m+p-1)(T_F+T_B)/2 =
    5 * 30 units (the collectives ride the free link). Per micro-batch, without SP
    (docs/oracles.md): the first stage's forward 2 all-reduces a layer and the embedding's, the last
    stage's 2 a layer and the loss's 3; backward 2 a layer and the LM head's on the last."""
    result = whatif(tmp_path, [{"tp": 2, "dp": 1, "sp": False}])
    target = result.targets[0]
    assert units(target.measures["step_s"]) == pytest.approx(5 * 30, rel=1e-3)
    expected = {(0, "F"): 2 * 2 + 1, (1, "F"): 2 * 2 + 3, (0, "B"): 2 * 2, (1, "B"): 2 * 2 + 1}
    for rank, lane in target.timeline.ranks.items():
        stage = rank // 2                      # Megatron's order: tp fastest
        tp_group = f"{2 * stage},{2 * stage + 1}"
        for p in lane.passes:
            inside = [c for c in lane.comm if p.start <= c.start < p.end
                      and c.kind == "all_reduce" and c.group == tp_group]
            assert len(inside) == expected[(stage, p.kind)], (rank, p)
        # the tied word embedding's gradient: once a step between the first and last stage
        tied = [c for c in lane.comm if c.group == f"{rank % 2},{rank % 2 + 2}"
                and c.kind == "all_reduce"]
        assert len(tied) == len(lane.steps) and {c.nbytes for c in tied} == {256 * 64 // 2 * 4}


def test_sequence_parallel_uses_gathers_and_scatters(tmp_path):
    """tp 2 with SP: forward per layer 2 all-gathers of the shard (s/t*b*h*4 bytes) and 2
    reduce-scatters of the whole activation; the last stage gathers once more before the head."""
    result = whatif(tmp_path, [{"tp": 2, "dp": 1, "sp": True}])
    lane = result.targets[0].timeline.ranks[2]                    # stage 1, tp rank 0
    f = next(p for p in lane.passes if p.kind == "F")
    inside = [c for c in lane.comm if f.start <= c.start <= f.end and c.kind != "recv"]
    kinds = [c.kind for c in inside]
    assert kinds.count("all_gather") == 2 * 2 + 1 and kinds.count("reduce_scatter") == 2 * 2
    assert kinds.count("all_reduce") == 3
    shard, whole = 64 // 2 * 2 * 64 * 4, 64 * 2 * 64 * 4
    assert {c.nbytes for c in inside if c.kind == "all_gather"} == {shard}
    assert {c.nbytes for c in inside if c.kind == "reduce_scatter"} == {whole}


@pytest.mark.parametrize("m", [4, 8])
def test_zb_h1_splits_the_backward_and_gives_the_papers_bubble(tmp_path, m):
    """1F1B -> ZB-H1: every op is a linear layer's, so W is half of each backward (its input-
    and weight-gradient matmuls have equal FLOPs): T_F = T_B = T_W = 20 units a stage; the
    bubble is (p-1)(T_F+T_B-T_W) / ((p-1)(T_F+T_B-T_W) + m(T_F+T_B+T_W)) (Qi et al. 2023)."""
    result = whatif(tmp_path, [{"schedule": "zb-h1", "microbatches": m}])
    target = result.targets[0]
    bubble = 1 * (20 + 20 - 20)
    assert target.measures["bubble_fraction"] == pytest.approx(bubble / (bubble + m * 60))
    kinds = [p.kind for p in target.timeline.ranks[0].passes if p.step == 1]
    assert kinds.count("W") == kinds.count("B") == kinds.count("F") == m


def test_alpha_beta_fit_and_the_ring_for_another_group_size():
    """Collectives over 2 ranks taking 2a + S*b (a ring all-reduce: 2(n-1) steps of latency a,
    2(n-1)/n * S bytes at b ns/byte): the fit recovers them; over 4 ranks the model gives the
    ring's 6a + 1.5*S*b; a reduce-scatter (n-1 steps, (n-1)/n * S) over 2 ranks a + S*b/2."""
    from viz.whatif.replay.graph import Comm, ExecutionGraph
    from viz.whatif.replay.models import CollectiveModel, LinkModel
    a, b = 40_000, 0.5
    graph = ExecutionGraph({}, [], [], {})
    for size in (1 << 14, 1 << 16, 1 << 18):
        for _ in range(3):
            t = 2 * a + size * b
            graph.add_comm(Comm("all_reduce", (0, 1), size, (0, 1), {0: t, 1: t + 5},
                                waited=True))
    model = CollectiveModel.from_graph(graph, LinkModel.from_graph(graph))
    fit = model.fits[("all_reduce", 2)]
    assert fit.alpha == pytest.approx(2 * a) and fit.beta == pytest.approx(b)
    assert fit.error == pytest.approx(0, abs=1e-12)
    size = 1 << 20
    ns, how = model.time("all_reduce", 4, size)
    assert ns == pytest.approx(6 * a + 1.5 * size * b) and "over 2 ranks" in how
    assert "(9 samples only)" in how              # a derivation says what little it rests on
    ns, how = model.time("reduce_scatter", 2, size)
    assert ns == pytest.approx(a + 0.5 * size * b) and "no reduce_scatter recorded" in how
    assert model.time("all_reduce", 2, size) == (pytest.approx(2 * a + size * b), None)
    # ProcessGroupGloo runs a reduce-scatter as an all-reduce of its whole input
    gloo = CollectiveModel.from_graph(graph, LinkModel.from_graph(graph), "gloo")
    ns, how = gloo.time("reduce_scatter", 2, size)
    assert ns == pytest.approx(2 * a + size * b) and "gloo runs it as an all_reduce" in how
    ns, how = gloo.time("reduce_scatter", 4, size)
    assert ns == pytest.approx(6 * a + 1.5 * size * b) and "over 2 ranks" in how


def test_a_gloo_reduce_scatter_recorded_is_read_as_the_all_reduce_it_ran():
    """Reduce-scatters recorded on gloo taking 2a + S*b (the all-reduce ProcessGroupGloo runs):
    an all-gather derived from them is the ring's: one step of latency a, and each rank
    moves the shard S it hands in, a + S*b."""
    from viz.whatif.replay.graph import Comm, ExecutionGraph
    from viz.whatif.replay.models import CollectiveModel, LinkModel
    a, b = 40_000, 0.5
    graph = ExecutionGraph({}, [], [], {})
    for size in (1 << 14, 1 << 16, 1 << 18):
        t = 2 * a + size * b
        graph.add_comm(Comm("reduce_scatter", (0, 1), size, (0, 1), {0: t, 1: t}, waited=True))
    model = CollectiveModel.from_graph(graph, LinkModel.from_graph(graph), "gloo")
    ns, how = model.time("all_gather", 2, 1 << 20)
    assert ns == pytest.approx(a + (1 << 20) * b) and "reduce_scatter fit" in how


def test_jitter_is_added_only_to_collectives_of_its_role():
    """Gradient buckets (dp) whose last member comes 10 to 30 units late against blocking TP
    all-reduces of the same size 1 to 3 units late: each role gets its own jitter (a mean of
    5 and 0.5 units over the steady lateness), and a role with none recorded gets none."""
    from viz.whatif.replay.graph import Comm, ExecutionGraph
    from viz.whatif.replay.models import CollectiveModel, LinkModel
    graph = ExecutionGraph({}, [], [], {})
    for group, spread in (((0, 1), 10), ((2, 3), 1)):
        for late in (spread, 3 * spread):
            lo, hi = group
            graph.add_comm(Comm("all_reduce", group, 64, group, {lo: 100, hi: 100},
                                waited=True, prompt=True, lateness={lo: -late, hi: late}))
    role = {(0, 1): "dp", (2, 3): "tp"}
    model = CollectiveModel.from_graph(graph, LinkModel.from_graph(graph),
                                       role_of=lambda c: role[c.group])
    # steady lateness of the later member: (spread + 3 spread) / 2; jitter: the last member's
    # lateness less that, 0 and spread, mean spread / 2
    assert model.time("all_reduce", 2, 64, "dp")[0] == pytest.approx(100 + 5)
    assert model.time("all_reduce", 2, 64, "tp")[0] == pytest.approx(100 + 0.5)
    assert model.time("all_reduce", 2, 64, "embedding")[0] == pytest.approx(100)


def test_replay_on_the_device_clock_of_a_gpu_recording():
    """The H100 fixture with its Kineto export merged: lanes on the device clock (kernels as
    compute); its replay reproduces the measured step and bubble."""
    assets = GPU_FIXTURE
    analysis = analyse(open_run(str(assets / "trace")),
                       kineto={0: (str(assets / "kineto.json.gz"),)})
    assert analysis.timeline.ranks[0].clock == "device"
    result = what_if(analysis, [])
    assert result.replayed["step_s"] == pytest.approx(result.measured["step_s"])
    assert result.replayed["bubble_fraction"] == pytest.approx(result.measured["bubble_fraction"])
    assert result.replay.ranks[0].clock == "device"


def late_callback_run(directory, meta=None):
    """A blocking all-reduce: rank 0 launches at 100, rank 1 at 300, both resume at 400 (their
    next op), but the recorded completion says 450 (gloo's callback, waiting for the GIL)."""
    from support.constructed.synthetic import SyntheticRank, write_run
    ranks = []
    for r, launch in ((0, 100), (1, 300)):
        rank = SyntheticRank(r, 2, {"tp": 1, "pp": 1, "dp": 2}, unit_ns=U, meta=meta)
        rank.op(0, 10)
        rank.next_step(0)
        rank.op(0, launch)
        rank.comm("all_reduce", launch, launch + 5, 450, group=(0, 1), nbytes=4096)
        rank.op(400, 500)
        rank.next_step(500)
        rank.op(500, 510)
        ranks.append(rank)
    write_run(directory, ranks)
    return analyse(open_run(str(directory)))


def test_a_late_callback_does_not_hide_a_blocking_wait(tmp_path):
    """In a trace recorded before completions were stamped where they happen (no
    ``completion`` key), the timeline counted 105-400 as host time on rank 0; the graph makes
    it a wait that ends at the resumption: the all-reduce's transfer is 400 - 300 = 100 units,
    rank 0 computes its two ops of 100 units, and the replay still gives the measured step.
    Rank 1 is late in every all-reduce of the group (there is one), so its lateness is
    steady, not jitter: none is added."""
    result = what_if(late_callback_run(tmp_path), [])
    assert result.replayed["step_s"] == pytest.approx(result.measured["step_s"])
    assert units(result.replayed["ranks"]["0"]["compute_s"]) == pytest.approx(100 + 100)
    assert units(result.measured["ranks"]["0"]["compute_s"]) == pytest.approx(495)
    fit = result.models[1]
    assert fit.startswith("collective all_reduce over 2 ranks: 100.0 us")
    assert fit.endswith("jitter 0.0 us (dp)")


def test_a_trace_that_stamps_completions_where_they_happen_is_read_as_it_is(tmp_path):
    """The same rows with ``completion`` 2 in the metadata (the recorder since the fix): the
    completion at 450 is when the rank had the result, so the host time 105-400 on rank 0 is
    compute as the timeline has it (ops 0-100 and 400-500, host time 105-400: 495 units a
    step), and the all-reduce's transfer is 450 - 300 = 150 units."""
    result = what_if(late_callback_run(tmp_path, {"completion": 2}), [])
    assert result.replayed["step_s"] == pytest.approx(result.measured["step_s"])
    assert units(result.replayed["ranks"]["0"]["compute_s"]) == pytest.approx(495)
    assert result.models[1].startswith("collective all_reduce over 2 ranks: 150.0 us")


def test_a_missing_rank_replays_what_is_there_and_refuses_targets(tmp_path):
    """Rank 1's trace is gone: the replay runs rank 0 alone (its messages complete as
    recorded), a target is refused in one line."""
    pipeline_run(tmp_path / "run")
    (tmp_path / "run" / "rank-1.arrow").unlink()
    analysis = analyse(open_run(str(tmp_path / "run")))
    result = what_if(analysis, [])
    assert sorted(result.replayed["ranks"]) == ["0"]
    assert result.replayed["step_s"] == pytest.approx(result.measured["step_s"])
    with pytest.raises(TargetError, match=r"rank\(s\) \[1\] of the recording have no readable"):
        what_if(analysis, [{"schedule": "gpipe"}])


def test_jitter_is_the_lateness_a_simulation_cannot_have():
    """Blocking all-reduces of one group: rank 1 is 5 units after the members' mean launch on
    average (steady: the simulation keeps it); the jitter of a collective is its last
    member's lateness less that, and a collective nobody waited for where it was launched
    (a gradient bucket) has none."""
    from viz.whatif.replay.graph import Comm
    from viz.whatif.replay.models import jitter
    lateness = [{0: -5, 1: 5}, {0: 10, 1: -10}, {0: -5, 1: 5}, {0: -20, 1: 20}]
    comms = [Comm("all_reduce", (0, 1), 64, (0, 1), {0: 1, 1: 1}, lateness=late, prompt=True)
             for late in lateness]
    comms.append(Comm("all_reduce", (0, 1), 64, (0, 1), {0: 1, 1: 1},
                      lateness={0: -500, 1: 500}))
    # mean lateness: rank 0 (-5 + 10 - 5 - 20) / 4 = -5, rank 1 +5; the last members' 5, 10,
    # 5, 20
    assert jitter(comms) == {0: 0.0, 1: 5.0, 2: 0.0, 3: 15.0}
