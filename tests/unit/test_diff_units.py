"""Unit tests of trace-diff's pieces on hand-made inputs (no runs): rank roles across layouts,
matching call-graph nodes without line numbers, node statuses, deltas and their formatting."""
from __future__ import annotations

from collections import Counter

from viz.analysis.callgraphs.op_groups import Frame
from viz.diff.files import FileMatch, match_files
from viz.diff.diffgraph import ADDED, CHANGED, REMOVED, UNCHANGED, build_diff_graph, prune_diff
from viz.diff.profile import Profile, merge, rank_profile
from viz.diff.result import ALL_RANKS, Delta, compare
from viz.diff.roles import assign_roles, grid_role, group_label, match_roles
from viz.diff.words import describe
from viz.analysis.timeline.grid import Grid
from viz.render.diffgraph_svg import to_dot
from viz.views.diff_table import fmt_rel
from support.diff_profiles import frames, group, profile


def test_grid_roles_follow_megatron_order():
    # t=2, d=2, p=4: global = tp + 2*(dp + 2*pp)
    grid = Grid(tp=2, dp=2, pp=4)
    assert grid_role(0, grid).key == ("stage", "first", 0, 0, 0)
    assert grid_role(3, grid).key == ("stage", "first", 1, 0, 1)
    assert grid_role(5, grid).key == ("stage", "middle 1", 1, 0, 0)
    assert grid_role(14, grid).key == ("stage", "last", 0, 0, 1)
    assert grid_role(14, grid).label == "stage last (3 of 4) · tp 0 · dp 1"
    # with context parallelism: global = tp + t*(cp + c*(dp + d*pp))
    cp = Grid(tp=2, cp=2, dp=1, pp=2)
    assert grid_role(6, cp).label == "stage last (1 of 2) · tp 0 · cp 1 · dp 0"
    assert cp.pipeline(6) == (2, 6) and group_label([0, 2], cp) == "cp group of 2"


def test_two_stages_match_the_end_stages_of_four():
    a, b, method = assign_roles({"tp": 1, "pp": 2, "dp": 1}, 2, [0, 1],
                                {"tp": 1, "pp": 4, "dp": 1}, 4, [0, 1, 2, 3])
    assert method.startswith("grid")
    matched, only_a, only_b = match_roles(a, b)
    assert [(ra, rb) for _, ra, rb in matched] == [(0, 0), (1, 3)]
    assert only_a == [] and only_b == [("stage middle 1 (1 of 4) · tp 0 · dp 0", 1),
                                       ("stage middle 2 (2 of 4) · tp 0 · dp 0", 2)]


def test_without_a_matching_config_ranks_match_by_index():
    # B's config does not describe its world (tp*pp*dp != 4): same-index ranks.
    a, b, method = assign_roles({"tp": 2, "pp": 1, "dp": 1}, 2, [0, 1], {"tp": 2}, 4,
                                [0, 1, 2, 3])
    assert method.startswith("same-index")
    assert a[1].key == b[1].key == ("rank", 1)
    assert b[3].key == ("rank", 3) and 3 not in a


def test_groups_are_named_by_the_grid_axes_they_span():
    grid = Grid(tp=2, dp=2, pp=4)    # global = tp + 2*(dp + 2*pp)
    assert group_label([0, 1], grid) == "tp group of 2"
    assert group_label([0, 2], grid) == "dp group of 2"
    assert group_label([1, 5, 9, 13], grid) == "pp group of 4"
    assert group_label([0, 12], grid) == "pp group of 2"          # first and last stage
    assert group_label([0, 1, 2, 3], grid) == "tp+dp group of 4"
    assert group_label(range(16), grid) == "tp+dp+pp group of 16"
    assert group_label([0, 1], None) == "group of 2"
    assert group_label([], grid) == "unresolved group"


def test_diff_graph_matches_functions_not_lines_nor_checkout_paths():
    # The same code in two checkouts, with every line shifted by an edit above it.
    a = [group(0, frames("/repo_a", ("main", 10), ("Block.forward", 30)), count=4, flops=64),
         group(0, frames("/repo_a", ("main", 10), ("Block.forward", 31)), op="c10d.allreduce_",
               kind="all_reduce", count=2, nbytes=8)]
    b = [group(0, frames("/tmp/repo_b", ("main", 14), ("Block.forward", 37)), count=4, flops=64),
         group(0, frames("/tmp/repo_b", ("main", 14), ("Block.forward", 38)),
               op="c10d.allreduce_", kind="all_reduce", count=2, nbytes=8)]
    paths_a = {f.file: "pkg/model.py" for g in a for f in g.path}
    paths_b = {f.file: "pkg/model.py" for g in b for f in g.path}
    dg = build_diff_graph("rank 0", a, paths_a, b, paths_b)
    assert {n.status for n in dg.nodes()} == {UNCHANGED}
    assert dg.counts()[UNCHANGED] == len(dg.graph) == 4   # main, Block.forward, 2 leaves
    forward = dg.node("pkg/model.py:Block.forward")
    assert (forward.a.ops, forward.b.ops, forward.a.comms, forward.a.flops) == (6, 6, 2, 64)


def test_diff_graph_statuses_and_figures():
    a = [group(0, frames("/r", ("main", 1), ("old", 2)), count=3),
         group(0, frames("/r", ("main", 1), ("kept", 5)), count=2, flops=100)]
    b = [group(0, frames("/r", ("main", 1), ("new", 2)), op="c10d.allgather_",
               kind="all_gather", count=1, nbytes=64),
         group(0, frames("/r", ("main", 1), ("kept", 5)), count=2, flops=50)]
    paths = {"/r/pkg/model.py": "pkg/model.py"}
    dg = build_diff_graph("rank 0", a, paths, b, paths)
    status = {n.id: n.status for n in dg.nodes()}
    assert status["pkg/model.py:old"] == REMOVED
    assert status["pkg/model.py:new"] == ADDED
    assert status["comm:pkg/model.py:new:forward:all_gather"] == ADDED
    assert status["pkg/model.py:kept"] == CHANGED      # same ops, half the FLOPs
    assert status["pkg/model.py:main"] == CHANGED      # 5 ops -> 3
    dot = to_dot(prune_diff(dg), a_name="A", b_name="B")
    assert "FLOP 100 -> 50" in dot and "ops 5 -> 3" in dot
    assert "added (only in B)" in dot and "removed (only in A)" in dot


def test_prune_keeps_changes_with_their_callers_before_unchanged_nodes():
    chain = [("main", 1)] + [(f"f{i}", i + 2) for i in range(30)]
    a = [group(0, frames("/r", *chain[:i + 2]), count=10) for i in range(30)]
    b = a + [group(0, frames("/r", ("main", 1), ("f0", 2), ("added", 9)), count=1)]
    paths = {"/r/pkg/model.py": "pkg/model.py"}
    pruned = prune_diff(build_diff_graph("x", a, paths, b, paths), max_nodes=6)
    kept = set(pruned.graph)
    assert {"pkg/model.py:added", "pkg/model.py:f0", "pkg/model.py:main"} <= kept
    assert len(kept) <= 6 and sum(pruned.hidden.values()) == 61 + 2 - len(kept)


def test_compare_separates_structure_sizes_and_time():
    a = profile(0, ops=Counter({("m", "aten.mm.default", "forward"): 4}),
                flops=Counter({"matmul": 100, "total": 100}))
    b = profile(1, ops=Counter({("m", "aten.mm.default", "forward"): 4}),
                flops=Counter({"matmul": 50, "total": 50}))
    same_structure = compare("role", a, b)
    assert not same_structure.structural and same_structure.sizes_changed
    time = {d.name: d for d in same_structure.deltas if d.category == "time"}
    assert (time["wall_s"].a, time["wall_s"].b) == (1.0, 2.0)
    b.ops[("m", "aten.add.Tensor", "forward")] += 1
    assert compare("role", a, b).structural
    merged = merge([a, b])
    assert merged.flops["matmul"] == 150 and merged.time["wall_s"] == 1.5
    assert merged.time["bubble_fraction"] is None


def test_relative_change_texts():
    assert fmt_rel(Delta("s", "ops", "x", 0, 5, "count")) == "new"
    assert fmt_rel(Delta("s", "ops", "x", 5, 0, "count")) == "gone"
    assert fmt_rel(Delta("s", "ops", "x", 8, 16, "count")) == "x2"
    assert fmt_rel(Delta("s", "ops", "x", 100, 90, "count")) == "-10.0%"
    assert fmt_rel(Delta("s", "time", "t", None, 1.0, "s")) == ""
    assert Delta("s", "ops", "x", 4, 2, "count").size == 0.5


def comm_profile(rank, comm, module_comm=()):
    """A profile with communication only: comm is {(kind, phase, group): (count, bytes)}."""
    p = Profile((rank,))
    for key, (count, nbytes) in comm.items():
        p.comm[key] += count
        p.comm_bytes[key] += nbytes
    for key, count in module_comm:
        p.module_comm[key] += count
    return p


def test_communication_changes_in_plain_words():
    dp = "dp group of 4"
    plain = comm_profile(0, {("all_reduce", "backward", dp): (6, 6 * 4096)})
    zero = comm_profile(0, {("reduce_scatter", "backward", dp): (6, 6 * 4096),
                            ("all_gather", "other", dp): (6, 6 * 1024)})
    assert describe(compare(ALL_RANKS, plain, zero)) == [
        "the all-reduce over the dp group of 4 became all-gather + reduce-scatter "
        "(the same traffic)"]
    ring = comm_profile(0, {("all_reduce", "backward", "cp+dp group of 8"): (6, 6 * 4096),
                            ("send", "forward", "cp group of 2"): (4, 4096),
                            ("recv", "forward", "cp group of 2"): (4, 4096)},
                        [(("GPTChunk.blocks.0.attn", "send", "forward"), 2),
                         (("GPTChunk.blocks.1.attn", "send", "forward"), 2)])
    assert describe(compare(ALL_RANKS, plain, ring)) == [
        "the all-reduces moved from the dp group of 4 to the cp+dp group of 8 (6)",
        "a ring of P2P appears over the cp group of 2 in GPTChunk.blocks.*.attn (4 sends)"]
    moe = comm_profile(0, {("all_reduce", "backward", dp): (4, 4 * 2048),
                           ("all_to_all", "forward", dp): (8, 8 * 512)},
                       [(("GPTChunk.blocks.1.mlp.experts", "all_to_all", "forward"), 8)])
    assert describe(compare(ALL_RANKS, plain, moe)) == [
        "all-to-alls appear over the dp group of 4 in GPTChunk.blocks.*.mlp.experts (8)",
        "2 of the 6 all-reduces over the dp group of 4 disappear"]
    assert describe(compare(ALL_RANKS, plain, plain)) == []


def test_modules_are_compared_through_every_wrapper():
    # One model's recorded paths under each wrapper (the names torch gives: see
    # tests/unit/test_model_paths.py), the same ops below each.
    recorded = {
        "bare": ("TinyGPT", "TinyGPT.blocks.0.mlp"),
        "ddp": ("DistributedDataParallel", "DistributedDataParallel.module.blocks.0.mlp"),
        "fsdp2": ("FSDPTinyGPT", "FSDPTinyGPT.blocks.0.mlp"),
        "fsdp2+checkpoint": ("FSDPTinyGPT",
                             "FSDPTinyGPT.blocks.0._checkpoint_wrapped_module.mlp"),
        "compile": ("OptimizedModule", "OptimizedModule._orig_mod.blocks.0.mlp"),
        "fsdp1": ("FullyShardedDataParallel",
                  "FullyShardedDataParallel._fsdp_wrapped_module.blocks.0.mlp"),
        "accelerate+deepspeed": ("DeepSpeedEngine", "DeepSpeedEngine.module.blocks.0.mlp"),
    }
    fs = frames("/r", ("main", 1))
    profiles = {how: rank_profile(0, [group(0, fs, module=root, count=1),
                                      group(0, fs, module=mlp, count=3),
                                      group(0, fs, module="", count=2)],
                                  [], {}, None, (1,), str)
                for how, (root, mlp) in recorded.items()}
    bare = profiles.pop("bare")
    assert dict(bare.ops) == {("(model)", "aten.mm.default", "forward"): 1,
                              ("blocks.0.mlp", "aten.mm.default", "forward"): 3,
                              ("(no module)", "aten.mm.default", "forward"): 2}
    for how, p in profiles.items():
        assert not compare("rank 0", bare, p).ops, how


def test_every_kind_that_changed_is_said():
    g = "group of 2"
    # DDP: one bucket's all-reduce, a broadcast, one all-gather at setup; FSDP2 (3 groups):
    # all-gathers forward and backward (each the local half of the parameters) and
    # reduce-scatters of the same gradients: an all-reduce moves 2(n-1)/n of its bytes, the
    # others (n-1)/n of the whole, so 3 halves of the traffic
    ddp = comm_profile(0, {("all_reduce", "grad_sync", g): (2, 2 * 4096),
                           ("broadcast", "other", g): (2, 64), ("all_gather", "other", g): (1, 8)})
    fsdp = comm_profile(0, {("reduce_scatter", "grad_sync", g): (6, 2 * 4096),
                            ("all_gather", "forward", g): (6, 4096),
                            ("all_gather", "backward", g): (4, 4096)})
    assert describe(compare(ALL_RANKS, ddp, fsdp)) == [
        "the all-reduce over the group of 2 became all-gather + reduce-scatter (1.5x the "
        "traffic)", "broadcasts over the group of 2 disappear (2)"]
    more = comm_profile(0, {("all_reduce", "grad_sync", g): (3, 3 * 4096),
                            ("broadcast", "other", g): (2, 128),
                            ("all_gather", "forward", g): (1, 8)})
    assert describe(compare(ALL_RANKS, ddp, more)) == [
        "all-gathers over the group of 2 change phase (forward 0 -> 1, other 1 -> 0)",
        "all-reduces over the group of 2 rise from 2 to 3",
        "broadcasts over the group of 2 carry 2x the bytes (2 calls in each run)"]


def test_a_renamed_script_is_matched_an_unrelated_file_is_not():
    def script(name, *qualnames):
        return [group(0, [Frame(f"/r/{name}", 1, "<module>", "<module>"),
                          Frame(f"/r/{name}", i + 2, q.split(".")[-1], q)])
                for i, q in enumerate(qualnames)]
    a = script("ddp_train.py", "main", "Block.forward") + script("data.py", "load", "batch")
    b = script("fsdp2_train.py", "main", "Block.forward", "wrap") + \
        script("tokens.py", "read", "split", "pad")
    paths_a = {f"/r/{n}": n for n in ("ddp_train.py", "data.py")}
    paths_b = {f"/r/{n}": n for n in ("fsdp2_train.py", "tokens.py")}
    shown, found = match_files(a, paths_a, b, paths_b)
    assert found == [FileMatch("ddp_train.py", "fsdp2_train.py", 3)]
    # tokens.py shares only "<module>" with data.py: less than half of either
    assert shown == {"/r/fsdp2_train.py": "ddp_train.py", "/r/tokens.py": "tokens.py"}
