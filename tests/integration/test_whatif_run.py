"""trace-whatif on a real traced run of the reference GPT (trace-run, gloo, 2 ranks, pp 2).

Real runs assert what load cannot change: the execution graph's passes and edges, the
targets' configurations, their passes, communications and groups, the files written and the
command's errors. Predicted and replayed times are tested on constructed recordings
(test_whatif.py); their error against real runs is a benchmark (benchmarks/whatif.py).
"""
from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import Counter

import pytest

from support.gpt_helpers import env, free_port
from viz.analysis import analyse
from viz.run import open_run
from viz.whatif.replay.graph import BEGIN, END, LAUNCH, STEP, WAIT, execution_graph
from support.paths import REPO

M = 4
MODEL = ["--tp", "1", "--pp", "2", "--layers", "4", "--hidden", "32", "--heads", "4",
         "--seq-len", "16", "--micro-batch-size", "2", "--steps", "3",
         "--microbatches", str(M)]
TARGETS = ["--schedule gpipe", "--microbatches 8", "--schedule interleaved --virtual-stages 2",
           "--schedule zb-h1", "--pp 1", "--tp 2 --pp 1 --no-sp", "--dp 2"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One traced run (steps 1- recorded) and trace-whatif's output for every target."""
    out = tmp_path_factory.mktemp("whatif")
    cmd = [sys.executable, "-m", "instrument.launch", "--nproc-per-node", "2",
           "--master-port", str(free_port()), "--out", str(out / "run"), "--steps", "1-",
           "--no-report", "-m", "sample_runs.train", *MODEL]
    proc = subprocess.run(cmd, cwd=REPO, env=env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    whatif = [sys.executable, "-m", "viz.whatif_cli", str(out / "run"), "--out",
              str(out / "whatif")] + [arg for t in TARGETS for arg in ("--target", t)]
    proc = subprocess.run(whatif, cwd=REPO, env=env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == str(out / "whatif" / "whatif.html")
    return out, json.loads((out / "whatif" / "whatif.json").read_text())


def test_the_execution_graph_holds_passes_p2p_edges_and_steps(run):
    out, _ = run
    analysis = analyse(open_run(str(out / "run")))
    graph = execution_graph(analysis.timeline, analysis.cross.matched)
    counted = {r: analysis.metrics[r].counted_steps for r in (0, 1)}
    for rank, program in graph.programs.items():
        ops = Counter(node.op for node in program)
        steps = len(counted[rank])
        assert ops[STEP] == steps
        assert ops[BEGIN] == ops[END] == 2 * M * steps          # an F and a B per micro-batch
        kinds = [graph.passes[n.value].kind for n in program if n.op == BEGIN]
        assert kinds.count("F") == kinds.count("B") == M * steps
        launched = {n.value for n in program if n.op == LAUNCH}
        assert {n.value for n in program if n.op == WAIT} <= launched
    p2p = [c for c in graph.comms if c.kind == "p2p"]
    # one activation and one gradient message per micro-batch and step, rank 0 <-> rank 1
    assert len(p2p) == 2 * M * len(counted[0])
    assert Counter((c.src, c.dst) for c in p2p) == {(0, 1): M * 2, (1, 0): M * 2}
    tied = [c for c in graph.comms if c.kind == "all_reduce" and len(c.members) == 2]
    assert len(tied) == len(counted[0])           # the tied embedding's, once a step


def test_the_recorder_says_its_completions_need_no_correction(run):
    """The recorder writes how it stamps completions
    (tracer.recorder.process.process_info.COMPLETION) into every trace it starts, and viz.whatif
    reads such traces as they are: no rank's waits are re-read from its host time
    (viz.whatif.replay.waits.late_completions)."""
    from tracer.recorder.process.process_info import COMPLETION
    from viz.whatif.replay.waits import late_completions
    out, _ = run
    analysis = analyse(open_run(str(out / "run")))
    assert sorted(analysis.ranks) == [0, 1]
    for mine in analysis.ranks.values():
        assert mine.meta["completion"] == COMPLETION == 2
        assert not late_completions(mine.meta)
    assert late_completions({k: v for k, v in analysis.ranks[0].meta.items()
                             if k != "completion"})


def test_whatif_json_follows_the_contract(run):
    _, doc = run
    assert doc["schema"] == "paratrace.whatif/1"
    base = doc["base"]
    assert base["config"]["pp"] == 2 and base["config"]["schedule"] == "1f1b"
    for m in (base["measured"], base["replayed"]):
        assert {"step_s", "bubble_fraction", "exposed_comm_s", "ranks"} <= set(m)
        assert sorted(m["ranks"]) == ["0", "1"]
        assert m["step_s"] == max(r["step_s"] for r in m["ranks"].values()) > 0
        assert m["bubble_fraction"] == pytest.approx(
            sum(r["bubble_fraction"] for r in m["ranks"].values()) / 2)
    assert len(doc["targets"]) == len(TARGETS)
    configs = [t["config"] for t in doc["targets"]]
    assert configs[0]["schedule"] == "gpipe" and configs[0]["microbatches"] == M
    assert configs[1]["microbatches"] == 8 and configs[1]["schedule"] == "1f1b"
    assert configs[2]["virtual_stages"] == 2
    assert (configs[4]["pp"], configs[4]["dp"]) == (1, 2)
    assert (configs[5]["tp"], configs[5]["pp"], configs[5]["dp"]) == (2, 1, 1)
    assert (configs[6]["pp"], configs[6]["dp"]) == (2, 2)
    for target in doc["targets"]:
        assert target["assumptions"] and all(isinstance(a, str) for a in target["assumptions"])
        world = target["config"]["tp"] * target["config"]["pp"] * target["config"]["dp"]
        assert sorted(target["predicted"]["ranks"], key=int) == [str(r) for r in range(world)]
        assert target["predicted"]["step_s"] > 0


def _passes(svg_path):
    """(rank, kind, title) of every pass drawn in a timeline SVG."""
    root = ET.parse(svg_path).getroot()
    ns = "{http://www.w3.org/2000/svg}"
    out = []
    for rect in root.iter(f"{ns}rect"):
        cls = rect.get("class", "")
        if cls.startswith("pass wait"):
            title = rect.find(f"{ns}title").text
            out.append((int(title.split()[1]), cls.split()[-1], title))
    return root, out


def test_predicted_timelines_show_each_targets_schedule(run):
    out, doc = run
    root, passes = _passes(out / "whatif" / doc["targets"][0]["timeline"])
    assert "predicted" in root.get("class")
    assert any("Predicted timeline" in (t.text or "") for t in root.iter(
        "{http://www.w3.org/2000/svg}text"))
    gpipe = [kind for rank, kind, title in passes if rank == 0 and " step 1:" in title]
    assert gpipe == ["F"] * M + ["B"] * M
    _, passes = _passes(out / "whatif" / doc["targets"][2]["timeline"])
    chunks = {title.split(" chunk ")[1].split()[0] for _, _, title in passes}
    assert chunks == {"0", "1"}
    _, passes = _passes(out / "whatif" / doc["targets"][3]["timeline"])
    assert {kind for _, kind, _ in passes} == {"F", "B", "W"}
    _, passes = _passes(out / "whatif" / doc["targets"][1]["timeline"])
    assert sum(1 for rank, kind, title in passes if rank == 1 and kind == "F"
               and " step 1:" in title) == 8
    root, _ = _passes(out / "whatif" / doc["base"]["timeline"])
    assert "Replayed timeline" in ET.tostring(root, encoding="unicode")


def test_the_page_ranks_targets_by_predicted_step(run):
    out, doc = run
    page = (out / "whatif" / "whatif.html").read_text()
    order = sorted(doc["targets"], key=lambda t: t["predicted"]["step_s"])
    places = [page.index(f">{t['title']}") for t in order]
    assert places == sorted(places)
    for target in doc["targets"]:
        assert f'href="{target["timeline"]}"' in page
    assert "measured" in page and "replayed" in page


@pytest.mark.parametrize("args,message", [
    (["--pp", "4"], "world size 2 is not a multiple of tp 1 x pp 4"),
    (["--target", "--layers 2"], "unrecognized arguments: --layers 2"),
    (["--target", ""], "names no option"),
    (["--microbatches", "0"], "must be a whole number >= 1"),
])
def test_bad_options_are_one_line_errors(run, tmp_path, args, message):
    out, _ = run
    proc = subprocess.run([sys.executable, "-m", "viz.whatif_cli", str(out / "run"), "--out",
                           str(tmp_path / "w"), *args], cwd=REPO, env=env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("trace-whatif: error:")
    assert message in lines[0]


def test_each_targets_collectives_are_summary_rows_and_gpipe_keeps_1f1bs(run):
    """Every target's collectives are summary.json's comm rows per rank; GPipe moves the
    same messages as the recorded 1F1B (an activation and a gradient per micro-batch, the
    tied embedding's all-reduce), so its rows equal the recording's own last step's."""
    from support.whatif_models import predicted_rows, real_step
    out, doc = run
    for target in doc["targets"]:
        world = target["config"]["tp"] * target["config"]["pp"] * target["config"]["dp"]
        assert sorted(target["collectives"], key=int) == [str(r) for r in range(world)]
        for rows in target["collectives"].values():
            assert all(set(r) == {"kind", "phase", "group", "dimension", "count", "bytes"}
                       for r in rows)
    real = real_step(out / "run")
    gpipe = doc["targets"][0]["collectives"]
    for rank in ("0", "1"):
        assert predicted_rows(gpipe[rank]) == real[rank]["comm"]
