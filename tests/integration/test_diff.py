"""trace-diff on real traced runs of the reference GPT (trace-run, gloo on CPU): the
acceptance checks, the output files, bad input. Runs are shared by every test of this module.
They assert structure, counts, FLOPs and bytes; times differ on every run and are only checked
to be shown (measured bubbles are a benchmark: benchmarks/bubbles.py).
"""
from __future__ import annotations

import json
import re
import subprocess
import shutil
import xml.etree.ElementTree as ET
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)

import tracer
from support import cli
from support.gpt_helpers import free_port
from tracer.files import rundir
from tracer.files.format import META_KEY, read_stream
from viz import diff
from viz.analysis import analyse
from viz.diff.diffgraph import ADDED, CHANGED, UNCHANGED
from viz.render import render_all
from viz.render.diff import FILES, DiffInput
from viz.views.diff_table import format_table
from viz.analysis.callgraphs.op_groups import group_ops
from viz.run import open_run
from support.paths import REPO

TINY = ["--layers", "2", "--hidden", "32", "--heads", "4", "--seq-len", "16",
        "--micro-batch-size", "2", "--microbatches", "2", "--steps", "2"]
STEPS, M, LAYERS = 2, 2, 2
COMPARED = 1        # of the 2 steps, step 1 is compared: step 0 carries the setup
PIPE = ["--tp", "1", "--pp", "2", "--layers", "4", "--hidden", "32", "--seq-len", "16",
        "--micro-batch-size", "2", "--microbatches", "4", "--steps", "4"]
PIPE_M, PIPE_RECORDED = 4, 3        # steps 1-3 recorded (step 0 is setup)
QUIET_ENV = dict(cli.ENV, PYTHONWARNINGS="ignore")
SVG = "{http://www.w3.org/2000/svg}"




def record_gpt(out, nproc: int, *args: str, record: tuple = (), cwd=None) -> str:
    """Trace ``python -m sample_runs.train args`` with trace-run; ``cwd`` is where the
    ``sample_runs`` package is imported from (python -m puts the working directory first)."""
    proc = cli.run("python", "-m", "instrument.launch", "--nproc-per-node", nproc,
                   "--master-port", free_port(), "--out", out, "--no-report", *record,
                   "-m", "sample_runs.train", *args, env=QUIET_ENV, cwd=cwd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return str(out)


def trace_diff(*args: str) -> subprocess.CompletedProcess:
    """The installed console script, as users run it."""
    return cli.run("trace-diff", *args, env=QUIET_ENV)


def edited_copy(root: Path) -> Path:
    """A copy of sample_runs where an edit shifted every line of the model and TP files."""
    shutil.copytree(REPO / "sample_runs", root / "sample_runs",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("model.py", "parallel/tensor_parallel.py"):
        path = root / "sample_runs" / name
        path.write_text("# An edit above everything: every line below moves down by 5.\n\n\n\n\n"
                        + path.read_text())
    return root


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("diff-runs")
    tp2 = ["--tp", "2", "--pp", "1", "--no-sp", *TINY]
    configs = {
        "tp1": (1, ["--tp", "1", "--pp", "1", *TINY], None),
        "tp2": (2, tp2, None),
        "sp": (2, ["--tp", "2", "--pp", "1", "--sp", *TINY], None),
        "tp2-edited": (2, tp2, edited_copy(root / "checkout")),
    }
    with ThreadPoolExecutor(4) as pool:
        futures = {name: pool.submit(record_gpt, root / name, n, *args, cwd=cwd)
                   for name, (n, args, cwd) in configs.items()}
        return {name: f.result() for name, f in futures.items()}


@pytest.fixture(scope="module")
def pipelines(tmp_path_factory):
    root = tmp_path_factory.mktemp("diff-pipelines")
    with ThreadPoolExecutor(2) as pool:
        futures = {name: pool.submit(record_gpt, root / name, 2, *PIPE, *schedule,
                                     record=("--steps", "1-"))
                   for name, schedule in (("1f1b", ["--schedule", "1f1b"]),
                                          ("interleaved", ["--schedule", "interleaved",
                                                           "--virtual-stages", "2"]))}
        return {name: f.result() for name, f in futures.items()}


def diffed(a: str, b: str) -> diff.DiffResult:
    return diff.diff_runs(open_run(a), open_run(b))


def keep_steps(src: str, dst: Path, steps: set) -> str:
    """A copy of run ``src`` holding only the events of ``steps`` (what trace-run --steps
    records), written batch by batch as the recorder wrote them."""
    out = dst / "traces"
    out.mkdir(parents=True)
    for rank, path in rundir.rank_files(rundir.traces_dir(src)).items():
        meta = tracer.load(path).meta
        _, schema, batches, _, _ = read_stream(path)
        options = pa.ipc.IpcWriteOptions(emit_dictionary_deltas=True)
        with pa.OSFile(rundir.trace_file(str(out), rank), "wb") as sink, \
                pa.ipc.new_stream(sink, schema, options=options) as writer:
            for i, batch in enumerate(batches):
                mask = pa.compute.is_in(batch.column("step"), pa.array(sorted(steps), pa.int32()))
                custom = {META_KEY: json.dumps(meta).encode()} if i == len(batches) - 1 else None
                writer.write_batch(batch.filter(mask), custom_metadata=custom)
    return str(dst)


def role(result: diff.DiffResult, label: str) -> diff.ScopeDiff:
    (found,) = [r for r in result.roles if r.label == label]
    return found


def test_tp1_vs_tp2_tp_all_reduces_appear_and_matmul_flops_halve(runs, tmp_path):
    proc = trace_diff(runs["tp1"], runs["tp2"], "--out", str(tmp_path), "--top", "40")
    assert proc.returncode == 0, proc.stderr
    assert "Structural change: world size 1 -> 2" in proc.stdout
    assert re.search(r"tp 0 · dp 0\s+comm: all_reduce forward \(tp group of 2\)\s+0\s+"
                     rf"{(2 * LAYERS + 4) * M * COMPARED}\s+new", proc.stdout), proc.stdout
    assert proc.stdout.strip().splitlines()[-1] == str(tmp_path / "diff.html")
    data = json.loads((tmp_path / "diff.json").read_text())
    assert data["schema"] == "paratrace.diff/1" and data["structural_change"]
    assert [r["role"] for r in data["only_b"]] == ["tp 1 · dp 0"]   # TP rank 1 is new
    (tp0,) = data["roles"]
    assert (tp0["scope"], tp0["a_ranks"], tp0["b_ranks"]) == ("tp 0 · dp 0", [0], [0])
    comm = {(c["kind"], c["phase"], c["group"]): (c["a_count"], c["b_count"])
            for c in tp0["comm"]}
    # docs/oracles.md: TP per micro-batch, forward 2L+4 all-reduces, backward 2L+1.
    tp = "tp group of 2"
    assert comm == {("all_reduce", "forward", tp): (0, (2 * LAYERS + 4) * M * COMPARED),
                    ("all_reduce", "backward", tp): (0, (2 * LAYERS + 1) * M * COMPARED)}
    # Which layers they appear in: g after attn.proj and mlp.fc2, f before qkv and fc1.
    per_module = {(c["module"], c["kind"], c["phase"]): c["b"] for c in tp0["module_comm"]}
    for i in range(LAYERS):
        for module, phase in (("attn.proj", "forward"), ("mlp.fc2", "forward"),
                              ("attn.qkv", "backward"), ("mlp.fc1", "backward")):
            assert per_module[(f"blocks.{i}.{module}", "all_reduce", phase)] == \
                M * COMPARED

    result = diffed(runs["tp1"], runs["tp2"])
    flops = {d.name: d for d in role(result, "tp 0 · dp 0").deltas if d.category == "flops"}
    assert flops["matmul"].a > 0 and flops["matmul"].b * 2 == flops["matmul"].a
    assert flops["attention"].b * 2 == flops["attention"].a    # heads split over TP
    total = {d.name: d for d in result.totals.deltas if d.category == "flops"}
    assert total["matmul"].a == total["matmul"].b              # the work is only divided


def test_tp2_vs_sp_all_reduce_becomes_all_gather_and_reduce_scatter_in_each_layer(runs):
    result = diffed(runs["tp2"], runs["sp"])
    assert result.structural_change and not result.only_a and not result.only_b
    assert [r.label for r in result.roles] == ["tp 0 · dp 0", "tp 1 · dp 0"]
    for scope in result.roles:
        layer = {}
        for (module, kind, phase), a, b in scope.module_comm:
            match = re.match(r"blocks\.(\d+)\.", module)
            if match:
                entry = layer.setdefault(int(match.group(1)), {})
                before, after = entry.get(kind, (0, 0))
                entry[kind] = (before + a, after + b)
        per_mb = M * COMPARED
        # reference-gpt.md: per layer and micro-batch, no SP: 4 all-reduces; SP: forward
        # 2 AG + 2 RS, backward 2 RS + 4 AG (2 re-gathers for the weight gradients).
        assert layer == {i: {"all_reduce": (4 * per_mb, 0), "all_gather": (0, 6 * per_mb),
                             "reduce_scatter": (0, 4 * per_mb)} for i in range(LAYERS)}
        # The linears still multiply the whole sequence (gathered first): same matmul FLOPs.
        assert scope.a.flops["matmul"] == scope.b.flops["matmul"] > 0
    # in plain words, over both ranks: without SP (2L+4)M forward and (2L+1)M backward
    # all-reduces per step; with SP the embedding's and the cross entropy's 4M stay, plus one
    # grad-sync all-reduce of the sequence-parallel parameters a step
    total = 2 * ((2 * LAYERS + 4) + (2 * LAYERS + 1)) * M * COMPARED
    kept = 2 * (4 * M + 1) * COMPARED
    (sentence,) = result.in_words
    assert sentence.startswith(f"{total - kept} of the {total} all-reduces over the tp group "
                               "of 2 became all-gather + reduce-scatter (")
    assert "blocks.*.attn.proj" in sentence and "GPTChunk" not in sentence


def p2p(scope: diff.ScopeDiff) -> dict:
    """(kind, phase) -> (A calls, B calls) of the P2P of a scope (all within a pipeline group)."""
    out = {}
    for kind, phase, group in set(scope.a.comm) | set(scope.b.comm):
        if kind in ("send", "recv"):
            assert group == "pp group of 2"
            key = (kind, phase, group)
            out[(kind, phase)] = (scope.a.comm.get(key, 0), scope.b.comm.get(key, 0))
    return out


def test_1f1b_vs_interleaved_p2p_doubles(pipelines):
    result = diffed(pipelines["1f1b"], pipelines["interleaved"])
    assert dict((k, (a, b)) for k, a, b in result.config_changes) == {
        "schedule": ("1f1b", "interleaved"), "virtual_stages": (1, 2)}
    mb = PIPE_M * PIPE_RECORDED
    first, last = (role(result, f"stage {name} ({i} of 2) · tp 0 · dp 0")
                   for i, name in enumerate(("first", "last")))
    # Every P2P stream of 1F1B carries v=2 times the messages; with two chunks per rank the
    # end stages also gain the streams between their chunks' neighbours (first stage's chunk 1
    # receives activations from the last stage's chunk 0, ...).
    assert p2p(first) == {("send", "forward"): (mb, 2 * mb), ("recv", "backward"): (mb, 2 * mb),
                          ("recv", "forward"): (0, mb), ("send", "backward"): (0, mb)}
    assert p2p(last) == {("recv", "forward"): (mb, 2 * mb), ("send", "backward"): (mb, 2 * mb),
                         ("send", "forward"): (0, mb), ("recv", "backward"): (0, mb)}
    # Over all ranks: one message per micro-batch per boundary between virtual stages, in
    # each direction: p-1 = 1 boundary -> v*p-1 = 3.
    assert p2p(result.totals) == {(k, ph): (mb, 3 * mb) for k in ("send", "recv")
                                  for ph in ("forward", "backward")}


def test_run_against_itself_has_no_structural_change(runs, tmp_path):
    run = open_run(runs["sp"])
    result = diff.diff_runs(run, run)
    table = format_table(result, top=15)
    assert "No structural change: on all 2 matched rank roles" in table
    assert "No op count, FLOP or communication figure differs." in table
    assert re.search(r"all ranks\s+wall_s\s+\S+ \S+\s+\S+ \S+\s+=", table), table
    render_all(FILES, DiffInput(result), str(tmp_path))
    data = json.loads((tmp_path / "diff.json").read_text())
    assert data["structural_change"] is False
    for scope in [data["totals"]] + data["roles"]:
        assert not scope["structural_change"]
        assert not scope["ops"] and not scope["functions"] and not scope["comm"]
        assert {d["category"] for d in scope["deltas"]} == {"time"}
    for graph in data["graphs"]:
        assert graph["nodes"][ADDED] == graph["nodes"][CHANGED] == 0
        assert graph["nodes"][UNCHANGED] > 20


def test_an_edit_that_moves_every_line_is_no_structural_change(runs):
    a, b = open_run(runs["tp2"]), open_run(runs["tp2-edited"])

    def model_lines(run):
        return {(f.file, f.line) for g in group_ops(run.load(0)) for f in g.path
                if f.file.endswith("sample_runs/model.py")}
    lines_a, lines_b = model_lines(a), model_lines(b)
    assert lines_a and lines_b and lines_a.isdisjoint(lines_b)   # other files, other lines
    result = diff.diff_runs(a, b)
    assert not result.structural_change, result.verdict()
    assert result.verdict().startswith("No structural change")
    assert all(n.status == UNCHANGED for g in result.graphs for n in g.nodes())


def test_runs_that_recorded_different_steps_are_compared_on_the_steps_both_count(runs,
                                                                             tmp_path):
    full = open_run(runs["tp2"])
    recorded = analyse(full).recorded_steps
    assert {0, 1} <= recorded      # two iterations (and what ran after the last optimizer step)
    # What trace-run --steps 1- records of the same run: no step 0 (setup, first iteration).
    later = open_run(keep_steps(runs["tp2"], tmp_path / "later", recorded - {0}))
    assert analyse(later).recorded_steps == recorded - {0}
    result = diff.diff_runs(full, later)
    # both count step 1 alone (step 0 is setup, the last step is not closed): one range for
    # every figure, said once
    assert result.compared_steps == (1,) and not result.warnings
    assert "Compared over step 1 of both runs (step 0, the setup, left out" in \
        format_table(result, 15)
    assert not result.structural_change, result.verdict()
    # One iteration: M micro-batches of (2L+4) forward TP all-reduces.
    assert result.roles[0].a.comm[("all_reduce", "forward", "tp group of 2")] == \
        (2 * LAYERS + 4) * M


def test_page_and_diff_call_graph_svg(runs, tmp_path):
    result = diffed(runs["tp1"], runs["tp2"])
    assert re.search(r"^\d+ op count, FLOP or communication figures differ \(--top 0\)\.$",
                     format_table(result, top=0), re.M)
    *_, page = render_all(FILES, DiffInput(result), str(tmp_path))
    html = open(page, encoding="utf-8").read()
    assert 'href="diff.json"' in html and 'href="diff-callgraph.svg"' in html
    assert "http://" not in html.replace("http://www.w3.org/", "")
    assert "https://" not in html
    assert re.findall(r"<script[^>]*>", html) == ['<script src="svgview.js">']
    assert "Timeline metrics side by side" in html and "pipeline_bubble_fraction" in html
    assert html.count("none (trace-report DIR)") == 2     # --no-report runs: no report to link
    root = ET.parse(tmp_path / "diff-callgraph-1.svg").getroot()      # role tp 0 · dp 0
    titles = [t.text or "" for t in root.iter(f"{SVG}title")]
    tooltips = [a.get("{http://www.w3.org/1999/xlink}title") or "" for a in root.iter(f"{SVG}a")]
    assert any(t.startswith("ADDED: forward all_reduce") for t in tooltips), tooltips[:20]
    assert any(t.startswith("CHANGED: ColumnParallelLinear.forward") for t in tooltips)
    texts = [t.text or "" for t in root.iter(f"{SVG}text")]
    assert any(re.match(r"FLOP [\d.]+ M -> [\d.]+ M", t) for t in texts)
    assert {"added (only in B)", "removed (only in A)", "changed: A -> B figures",
            "unchanged structure"} <= set(texts)
    fills = {p.get("fill") for p in root.iter(f"{SVG}path")} | \
        {p.get("fill") for p in root.iter(f"{SVG}polygon")}
    assert {"#e8f5e9", "#fff3e0", "#ffffff"} <= fills
    assert len(titles) > 10


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    missing = tmp_path / "missing"
    empty = tmp_path / "empty"
    empty.mkdir()
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "rank-0.arrow").write_bytes(b"not an arrow stream at all")
    cases = {"missing": (missing, "no such run directory"), "empty": (empty, "no trace files"),
             "garbage": (garbage, "no readable trace")}
    with ThreadPoolExecutor(3) as pool:
        procs = dict(zip(cases, pool.map(lambda c: trace_diff(str(c[0]), str(c[0])),
                                         cases.values())))
    for case, proc in procs.items():
        path, reason = cases[case]
        assert proc.returncode == 2, (case, proc.stderr)
        assert proc.stderr.startswith(f"trace-diff: error: {path}") and reason in proc.stderr
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stdout == ""
