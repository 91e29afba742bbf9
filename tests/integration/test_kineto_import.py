"""torch.profiler exports analysed on their own (``trace-report OUT --kineto FILE...|DIR``), on
real exports: Holistic Trace Analysis's public test data (tests/assets/kineto-hta, MIT) and a
2-rank gloo profile with stacks and modules recorded here (tests/assets/kineto-cpu-gloo).

Expected numbers come from tests/support/kineto_oracle.py (the JSON read whole by the standard
library, exact decimals, unions swept in plain Python) or from counting the JSON's events in
the test itself; never from paratrace. Each point where Holistic Trace Analysis 0.5.0 goes
wrong on these files has its test here (docs/kineto.md)."""
from __future__ import annotations

import gzip
import json
import os
import re
from collections import Counter
from pathlib import Path

import pytest

from support import kineto_oracle
from tracer.files.device_format import read_device
from viz.analysis import analyse
from viz.engine import Engine
from tracer.kineto.imported_run import import_exports
from viz.run import open_run
from viz.render.summary_schema import build_summary
from support.paths import ASSETS

HTA = ASSETS / "kineto-hta"
GLOO = ASSETS / "kineto-cpu-gloo"
GPU_EXPORTS = ["nccl_data.json.gz", "sampled_rank-0.json.gz", "sampled_rank-1.json.gz",
               "ns_resolution_rank-0.json.gz", "legacy_inference_rank_1.json.gz",
               "rocm_mi250.json.gz", "alexnet_cuda_sync.json.gz"]


def imported(out: Path, *entries) -> tuple:
    """(summary, analysis) of the exports ``entries`` imported into ``out`` (no HTML)."""
    with Engine(jobs=1) as engine:
        import_exports(str(out), [str(e) for e in entries], engine)
        analysis = analyse(open_run(str(out)), engine)
    return build_summary(analysis), analysis


def events_of(path: Path) -> list:
    with gzip.open(path, "rt") as fh:
        return json.load(fh)["traceEvents"]


@pytest.fixture(scope="module")
def alone(tmp_path_factory) -> dict:
    """Each GPU export imported on its own: name -> (summary, its rank's summary entry)."""
    out = {}
    for name in GPU_EXPORTS:
        summary, _ = imported(tmp_path_factory.mktemp(name.split(".")[0]), HTA / name)
        (rank,) = [r for r in summary["ranks"].values() if r["status"] == "ok"]
        out[name] = (summary, rank)
    return out


@pytest.mark.parametrize("name", GPU_EXPORTS)
def test_device_whole_equals_the_independent_computation(alone, name):
    expected = kineto_oracle.whole(kineto_oracle.load(HTA / name))
    whole = alone[name][1]["device"]["whole"]
    for key in ("kernels", "memcpys", "memsets", "comm_kernels"):
        assert whole[key] == expected[key], key
    for key in ("span_s", "busy_s", "compute_s", "comm_s", "memory_s", "idle_s"):
        assert whole[key] == pytest.approx(expected[key], rel=1e-3, abs=1e-9), key
    if expected["overlap_fraction"] is None:
        assert whole["overlap_fraction"] is None and whole["why_null"]["overlap_fraction"]
    else:
        assert whole["overlap_fraction"] == pytest.approx(expected["overlap_fraction"],
                                                          rel=1e-3)


def test_cuda_sync_is_no_gpu_time(alone):
    """HTA counts cuda_sync events as GPU time; they are the host waiting for the GPU."""
    events = events_of(HTA / "alexnet_cuda_sync.json.gz")
    syncs = [e for e in events if e.get("cat") == "cuda_sync"]
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    assert len(syncs) == 41
    device = alone["alexnet_cuda_sync.json.gz"][1]["device"]
    assert device["activities"] == len(gpu) == 98
    last = max(e["ts"] + e["dur"] for e in gpu)
    assert any(e["ts"] + e["dur"] > last for e in syncs)     # a sync reaching past the GPU work
    first = min(e["ts"] for e in gpu)
    assert device["whole"]["span_s"] == pytest.approx((last - first) / 1e6, abs=1e-9)


def test_no_step_is_dropped(alone):
    """HTA drops every GPU event from the last ProfilerStep on; here each ProfilerStep#N is
    step N, the last one counted, and every activity is in device.whole."""
    events = events_of(HTA / "nccl_data.json.gz")
    steps = sorted(int(e["name"].split("#")[1]) for e in events
                   if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#"))
    assert steps == [4, 5, 6]
    rank = alone["nccl_data.json.gz"][1]
    assert [s for s in rank["steps"] if s in steps] == steps
    assert rank["time"]["counted_steps"] == steps      # every ProfilerStep counts
    last = next(s for s in rank["time"]["per_step"] if s["step"] == 6)
    assert last["compute_s"] > 0 and last["comm_s"] > 0
    gpu = sum(e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") for e in events)
    assert rank["device"]["activities"] == gpu == 3774


def test_time_is_exact_nanoseconds(tmp_path):
    """ns resolution, absolute ts without baseTimeNanoseconds: every activity's start and end
    are the export's to the nanosecond (HTA rounds them to µs and gets negative durations)."""
    _, analysis = imported(tmp_path, HTA / "ns_resolution_rank-0.json.gz")
    records, _, _ = read_device(str(tmp_path / "traces" / "rank-0.device.arrow"))
    acts = kineto_oracle.activities(kineto_oracle.load(HTA / "ns_resolution_rank-0.json.gz"))
    assert sorted(zip(records.start[~records.is_launch].tolist(),
                      records.end[~records.is_launch].tolist())) == \
        sorted((s, e) for _, _, s, e in acts)
    assert any(s % 1000 for _, _, s, _ in acts)              # really below the microsecond
    assert (records.end >= records.start).all()


def test_no_nan_anywhere(alone):
    for summary, _ in alone.values():
        json.dumps(summary, allow_nan=False)                  # raises on NaN or Infinity
    rank = alone["ns_resolution_rank-0.json.gz"][1]           # NCCL on a world of one
    assert rank["device"]["whole"]["comm_kernels"] == 0
    assert rank["device"]["whole"]["why_null"] == {
        "overlap_fraction": "no NCCL kernel: no device communication"}
    assert rank["time"]["overlap_fraction"] is None
    assert rank["time"]["why_null"]["overlap_fraction"]


def test_compact_json_gives_the_right_rank(tmp_path, alone):
    """HTA's rank regex needs a space after the colon and reads a compact file as rank 0."""
    with gzip.open(HTA / "sampled_rank-1.json.gz", "rt") as fh:
        export = json.load(fh)
    compact = tmp_path / "compact.json"
    compact.write_text(json.dumps(export, separators=(",", ":")))
    assert '"rank":1' in compact.read_text()
    summary, _ = imported(tmp_path / "run", HTA / "sampled_rank-0.json.gz", compact)
    assert summary["world_size"] == 128
    assert [r for r, v in summary["ranks"].items() if v["status"] == "ok"] == ["0", "1"]
    assert summary["ranks"]["1"]["device"]["whole"] == \
        alone["sampled_rank-1.json.gz"][1]["device"]["whole"]
    # their collectives name no process group (no pg_config, no group arguments): never
    # compared across ranks, so no false mismatch between collectives of different groups
    assert summary["ranks"]["0"]["comm"] and summary["cross_rank"]["matched"] == 0
    assert summary["cross_rank"]["unmatched"] == 0 and not summary["cross_rank"]["mismatches"]


def test_both_nccl_kernel_names_are_communication(tmp_path, alone):
    """NCCL 2.19 on names its kernels ncclDevKernel_*, earlier ncclKernel_*; HTA's straggler
    detection matches only the latter. The same real export with its kernels renamed."""
    text = gzip.open(HTA / "nccl_data.json.gz", "rt").read()
    assert text.count("ncclKernel_") == 21 and "ncclDevKernel_" not in text
    renamed = tmp_path / "dev.json"
    renamed.write_text(text.replace("ncclKernel_", "ncclDevKernel_"))
    summary, _ = imported(tmp_path / "run", renamed)
    old = alone["nccl_data.json.gz"][1]
    new = summary["ranks"]["0"]
    assert new["device"]["whole"] == old["device"]["whole"]
    assert new["device"]["whole"]["comm_kernels"] == 21
    assert new["time"]["comm_s"] == old["time"]["comm_s"] > 0
    assert [c["kind"] for c in new["comm"]] == [c["kind"] for c in old["comm"]]


def test_a_cpu_only_export_gives_a_report(tmp_path):
    from viz.cli import report_main
    code = report_main([str(tmp_path), "--kineto", str(HTA / "cpu_only_rank-34.json.gz"),
                        "--jobs", "1"])
    assert code == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    rank = summary["ranks"]["34"]
    assert summary["world_size"] == 300 and rank["status"] == "ok"
    assert rank["time"]["clock"] == "host" and "device" not in rank
    cpu_ops = [e for e in events_of(HTA / "cpu_only_rank-34.json.gz") if e.get("cat") == "cpu_op"]
    assert sum(rank["op_counts"].values()) == len(cpu_ops) == 4
    front = (tmp_path / "index.html").read_text()
    assert "not derivable and not shown" in front and "GPU time (no GPU activity" in front


# ---------------------------------------------------------------------------- 2 ranks, gloo
@pytest.fixture(scope="module")
def gloo(tmp_path_factory) -> tuple:
    """The 2-rank gloo profile, given as a directory, through the command line (the report
    too)."""
    from viz.cli import report_main
    out = tmp_path_factory.mktemp("gloo")
    assert report_main([str(out), "--kineto", str(GLOO), "--jobs", "1"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    return out, summary, {r: events_of(GLOO / f"rank-{r}.json.gz") for r in (0, 1)}


def _outermost(events: list, name: str) -> int:
    """Calls of op ``name`` that no other op (``ns::name``) encloses, counted from the JSON."""
    ops = sorted(((e["tid"], e["ts"], -e["dur"], e["name"]) for e in events
                  if e.get("cat") == "cpu_op" and e.get("ph") == "X"
                  and re.match(r"^(aten|c10d)::\w+$", e["name"])))
    count, open_end = 0, {}
    for tid, ts, neg, op in ops:
        if ts < open_end.get(tid, -1):
            continue
        open_end[tid] = ts - neg
        count += op == name
    return count


def test_ops_and_collectives_of_each_rank(gloo):
    _, summary, events = gloo
    for r in (0, 1):
        rank = summary["ranks"][str(r)]
        for op in ("aten::linear", "aten::mm", "c10d::allreduce_", "c10d::broadcast_"):
            assert rank["op_counts"].get(op.replace("::", ".", 1), 0) == \
                _outermost(events[r], op) > 0, op
        comm = {(c["kind"], c["phase"]): c for c in rank["comm"]}
        # DDP's gradient all-reduce, from the autograd engine's AccumulateGrad: 8417 floats
        assert comm[("all_reduce", "grad_sync")]["count"] == 2
        assert comm[("all_reduce", "grad_sync")]["bytes"] == 2 * 8417 * 4
        # outside any module with grad mode on (torch gave it an autograd sequence number):
        # forward, as the recorder decides
        (broadcast,) = {"forward" if "Sequence number" in e["args"] else "other"
                        for e in events[r] if e["name"] == "c10d::broadcast_"}
        assert broadcast == "forward"
        assert comm[("broadcast", broadcast)]["bytes"] == 2 * 4 * 4
        assert rank["comm"][0]["group"] == [0, 1]
        assert ("send" if r == 0 else "recv", broadcast) in comm


def test_collectives_match_across_ranks_like_a_recording(gloo):
    _, summary, events = gloo
    collectives = sum(1 for e in events[0] if e.get("cat") == "cpu_op" and e["name"] in (
        "c10d::allreduce_", "c10d::broadcast_", "c10d::allgather_"))
    cross = summary["cross_rank"]
    assert collectives == 6
    assert cross["matched"] == collectives and cross["unmatched"] == 0
    assert cross["unmatched_p2p"] == 0            # rank 0's sends met rank 1's receives
    assert {c["kind"] for c in cross["collectives"]} == {"all_reduce", "broadcast",
                                                         "all_gather"}


def test_stacks_modules_and_phases(gloo):
    out, summary, _ = gloo
    analysis = analyse(open_run(str(out)))
    groups = analysis.ranks[0].op_groups
    linear = [g for g in groups if g.op == "aten.linear" and g.phase == "forward"]
    assert {g.module.rsplit(".", 1)[-1] for g in linear} == {"Linear_0", "Linear_1",
                                                             "Linear_2", "Linear_3",
                                                             "Linear_4"}
    assert all(g.path[-1].file == "record.py" and g.path[-1].line in (30, 40) for g in linear)
    # backward ops land on the forward line and module that made their autograd node
    mm_backward = [g for g in groups if g.op == "aten.mm" and g.phase == "backward"]
    assert mm_backward and all(g.module and "Linear_" in g.module for g in mm_backward)
    assert all(g.path[-1].file == "record.py" for g in mm_backward)
    phases = {g.phase for g in groups}
    assert phases >= {"forward", "backward", "grad_sync", "optimizer"}
    optimizer = [g for g in groups if g.phase == "optimizer"]
    assert any(g.op.startswith("aten.add_") for g in optimizer)
    assert summary["ranks"]["0"]["steps"][:2] == [2, 3]


def test_a_second_import_replaces_the_first(gloo, tmp_path):
    """trace-report OUT --kineto again: the exports' traces are replaced, never merged into
    (a merge would double every GPU activity), and trace-report OUT alone rereads them."""
    import shutil

    from viz.cli import report_main
    first, summary, _ = gloo
    out = tmp_path / "run"
    shutil.copytree(first / "traces", out / "traces")
    assert report_main([str(out), "--kineto", str(GLOO / "rank-0.json.gz"), "--jobs", "1"]) == 0
    again = json.loads((out / "summary.json").read_text())
    assert sorted(os.listdir(out / "traces")) == ["rank-0.arrow"]
    assert again["ranks"]["0"]["op_counts"] == summary["ranks"]["0"]["op_counts"]
    assert report_main([str(out), "--out", str(tmp_path / "again"), "--jobs", "1"]) == 0
    assert json.loads((tmp_path / "again" / "summary.json").read_text())["ranks"]["0"][
        "op_counts"] == \
        summary["ranks"]["0"]["op_counts"]


def test_op_counts_by_name_come_from_the_export(gloo):
    _, summary, events = gloo
    names = Counter(e["name"] for e in events[1] if e.get("cat") == "cpu_op")
    assert names["c10d::recv_"] == 2 == summary["ranks"]["1"]["op_counts"]["c10d.recv_"]


def test_worker_processes_and_dask_import_what_one_process_imports(tmp_path):
    """Each export is a task on the engine: worker processes (--jobs) and a Dask cluster (a
    real local one, its workers seeing the same files) give the same summary."""
    from dask.distributed import LocalCluster

    def summary(out: Path, engine: Engine) -> dict:
        with engine:
            import_exports(str(out), [str(GLOO)], engine)
            return build_summary(analyse(open_run(str(out)), engine))
    one = summary(tmp_path / "one", Engine(jobs=1))
    assert summary(tmp_path / "two", Engine(jobs=2)) == one
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster:
        assert summary(tmp_path / "dask", Engine(dask=cluster.scheduler_address)) == one
    assert sorted(os.listdir(tmp_path / "dask" / "traces")) == ["rank-0.arrow", "rank-1.arrow"]


# ---------------------------------------------------------------------------- read whole
WHOLE = [HTA / "trace_diff_test.json.gz", HTA / "trace_diff_control.json.gz",
         ASSETS / "gpu-h100" / "kineto.json.gz"]


@pytest.mark.parametrize("export", WHOLE, ids=lambda p: p.name)
def test_a_real_export_is_read_and_drawn_whole(tmp_path, capsys, export):
    """HTA's trace_diff exports and the H100 export: the whole report, every call graph drawn.
    On trace_diff's test export an op site without stacks holds 30 op kinds, CUDA kernels of
    names up to 1,000 characters among them: their unbounded tooltip passed graphviz's
    16,384-character limit, and trace-report ended in an internal error (AttributeError in
    callgraph_svg) with no page but summary.json written."""
    from viz.cli import report_main
    code = report_main([str(tmp_path), "--kineto", str(export), "--jobs", "1"])
    err = capsys.readouterr().err
    assert code == 0 and "internal error" not in err and "not drawn" not in err, err
    summary = json.loads((tmp_path / "summary.json").read_text())
    (rank,) = [r for r in summary["ranks"].values() if r["status"] == "ok"]
    expected = kineto_oracle.whole(kineto_oracle.load(export))
    for key in ("kernels", "memcpys", "memsets", "comm_kernels"):
        assert rank["device"]["whole"][key] == expected[key], key
    pages = sorted((tmp_path / "callgraphs").glob("*.html"))
    assert pages and [p.with_suffix(".svg").exists() for p in pages] == [True] * len(pages)
    for svg in (tmp_path / "callgraphs").glob("*.svg"):
        titles = re.findall(r"<title>(.*?)</title>", svg.read_text(), re.S)
        assert max(len(t) for t in titles) < 16_384
    for name in ("index.html", "modules.html", "timeline.svg", "crossrank.html"):
        assert (tmp_path / name).stat().st_size > 0
    if export.name == "trace_diff_test.json.gz":
        assert "more op kinds" in (tmp_path / "callgraphs" / "all.svg").read_text()
