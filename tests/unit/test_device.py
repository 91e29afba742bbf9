"""Device time without a GPU: the real H100 recording in tests/assets/gpu-h100 (paratrace's
trace and torch.profiler's CUPTI export of the same process; its README says how it was made), and constructed device records for the NCCL
path, whose overlap and exposed communication are known exactly."""
from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from support import attribution_oracle
import tracer
from tracer.files import rundir
from tracer.files.device_format import (DeviceRecords, DeviceWriter, KINDS, read_device,
                                        warm_up)
from tracer.kineto.chrome_trace import load_chrome_trace
from support.constructed.synthetic import SyntheticRank
from viz.analysis import analyse
from viz.analysis.device.gpu_attribution import attribute
from viz.run import open_run
from viz.render.summary_schema import build_summary, device_json
from support.paths import GPU_FIXTURE

FIXTURE = GPU_FIXTURE
KINETO = FIXTURE / "kineto.json.gz"
MATMUL = ("aten.mm.", "aten.addmm.", "aten.bmm.", "aten.baddbmm.", "aten.linear.")


@pytest.fixture(scope="module")
def fixture_run(tmp_path_factory) -> Path:
    """The fixture's trace in a run directory of its own (the fixture stays read-only)."""
    run = tmp_path_factory.mktemp("h100")
    shutil.copytree(FIXTURE / "trace", run / "traces")
    return run


@pytest.fixture(scope="module")
def attributed():
    trace = tracer.load(str(FIXTURE / "trace" / "rank-0.arrow"))
    return trace, attribute(trace, load_chrome_trace(str(KINETO)))


def test_every_gpu_activity_of_the_h100_recording_is_attributed(attributed):
    trace, dev = attributed
    assert len(dev) == 1666                      # the README's count
    summary = device_json(dev.summary(trace.dictionary("op"), trace.col("op")))
    assert summary["attributed"] / summary["activities"] >= 0.99
    # inside an event's host interval; NCCL communicator setup in init_process_group (the
    # trace predates the recorder's own event for it); inside an annotation range and none of
    # its events: none here (the 2 between events lie outside every range); between two
    # events: nearer one. The counts of the README's method, computed apart from the code
    # (tests/support/attribution_oracle.py)
    expected = attribution_oracle.counts(attribution_oracle.attribute(
        attribution_oracle.launches(), attribution_oracle.events(),
        regions=attribution_oracle.ranges()))
    assert summary["attributed_by"] == expected == {
        "inside_an_event": 1340, "inside_a_region": 0, "process_group_setup": 324,
        "between_events": 2}


def test_each_launch_lands_where_the_readme_method_puts_it(attributed):
    """Launch by launch, the code's attribution is the independent computation's: the same
    event row inside an event, the same setup and between-events launches. The README first
    said 1,338 / 324 / 4: it took every event's [t0, t1], and the DtoD copies that
    all_gather_into_tensor and reduce_scatter_tensor launch during their calls fell outside
    them, as those collectives have no t1 (NCCL on a world of one never completed them while
    recording; the trace lists them in flight). A collective launches during its call, t0 to
    its return (docs/gpu.md): these 2 are inside. The clock mappings differ (the code: the
    trace's start time, a float of seconds; the README: clocks.json's pair) by less than any
    launch comes to an event's edge, so they move nothing."""
    _, dev = attributed
    acts, evs = attribution_oracle.launches(), attribution_oracle.events()
    expected = attribution_oracle.attribute(acts, evs, regions=attribution_oracle.ranges())
    how = {0: "inside", 1: "setup", 2: "between", 3: "region", -1: None}
    got = [(how[h], row if h in (0, 3) else None) for h, row in zip(dev.how.tolist(),
                                                                     dev.row.tolist())]
    assert got == expected
    first_wording = attribution_oracle.attribute(acts, evs, collective_call=False)
    assert attribution_oracle.counts(first_wording) == {
        "inside_an_event": 1338, "inside_a_region": 0, "process_group_setup": 324,
        "between_events": 4}
    ops = {row: op for row, op, *_ in evs}
    moved = [(acts[i][:2], ops[expected[i][1]]) for i in range(len(acts))
             if first_wording[i] != expected[i]]
    assert moved == [(("gpu_memcpy", "Memcpy DtoD (Device -> Device)"), op) for op in
                     ("c10d._allgather_base_.default", "c10d._reduce_scatter_base_.default")]
    clocks = json.loads((FIXTURE / "clocks.json").read_text())
    drift = abs(clocks["end"]["time_ns"] - clocks["end"]["perf_counter_ns"]
                - clocks["start"]["time_ns"] + clocks["start"]["perf_counter_ns"])
    apart = np.abs(dev.launch - np.array([when for _, _, when in acts])).max()
    assert apart + drift < attribution_oracle.closest_boundary_ns(acts, evs)


def test_gemm_kernels_land_on_the_matmul_ops(attributed):
    trace, dev = attributed
    names, op_names, codes = dev.names, trace.dictionary("op"), trace.col("op")
    gemm = np.array(["gemm" in names[n] for n in dev.name])
    dur = dev.end - dev.start
    on_matmul = np.array([r >= 0 and op_names[codes[r]].startswith(MATMUL) for r in dev.row])
    assert dur[gemm].sum() > 15_000_000                       # ~16 ms of GEMMs in 2 steps
    assert dur[gemm & on_matmul].sum() == dur[gemm].sum()
    # aten.mm's device time: its GEMMs, ~16 ms (the fixture's README)
    mm = device_json(dev.summary(op_names, codes))["by_op"]["aten.mm.default"]
    assert mm == pytest.approx(0.016, abs=5e-4)


# ---------------------------------------------------------------------------- NCCL, constructed
OFFSET = 1_700_000_000_000_000_000        # Unix ns = the rank's clock + OFFSET
U = 1_000


def records(rows: list) -> DeviceRecords:
    """rows: (kind, name, start, end, stream, corr, tid) in units of the rank's clock."""
    names = sorted({r[1] for r in rows})
    cols = np.array([(KINDS.index(k), names.index(n), OFFSET + 1_000_000_000 + s * U,
                      OFFSET + 1_000_000_000 + e * U, 0, stream, corr, tid, -1)
                     for k, n, s, e, stream, corr, tid in rows], dtype=np.int64)
    return DeviceRecords(*(cols[:, i] for i in range(9)), names=names)


def test_nccl_overlap_and_exposed_communication_on_the_device_clock(tmp_path):
    """Host: op A launches a GEMM at 1, the all-reduce launches its NCCL kernel at 12, op B a
    second GEMM at 14; the host is done at 15. GPU: GEMMs [5, 40) and [40, 70) on stream 7,
    NCCL [20, 90) on stream 20. Device compute [5, 70) = 65; comm [20, 90) = 70, of which
    [20, 70) overlaps compute: 50 overlapped, 20 exposed; the step [5, 100) idles 10."""
    r = SyntheticRank(0, 2, unit_ns=U,
                      meta={"clock_pairs": [{"perf_ns": 1_000_000_000,
                                             "unix_ns": 1_000_000_000 + OFFSET}]})
    r.op(-30, -20)
    r.next_step(0)
    r.op(0, 10, name="aten.mm.default")
    r.comm("all_reduce", 11, 13, 13, group=(0, 1), nbytes=4 << 20)
    r.op(14, 15, name="aten.mm.default")
    r.next_step(99)
    r.op(100, 101, name="aten.add.Tensor")
    path = r.write(tmp_path)
    device = DeviceWriter(rundir.device_file(str(tmp_path), 0), {"rank": 0})
    device.write(records([
        ("runtime", "cudaLaunchKernel", 1, 2, -1, 1, 7), ("kernel", "gemm_a", 5, 40, 7, 1, -1),
        ("runtime", "ncclLaunch", 12, 12, -1, 2, 7),
        ("kernel", "ncclDevKernel_AllReduce_Sum_f32", 20, 90, 20, 2, -1),
        ("runtime", "cudaLaunchKernel", 14, 14, -1, 3, 7), ("kernel", "gemm_b", 40, 70, 7, 3, -1),
        ("runtime", "cudaLaunchKernel", 100, 100, -1, 4, 7), ("kernel", "add", 100, 101, 7, 4, -1),
    ]), {"window": 0})
    device.close()
    assert len(read_device(rundir.device_file(str(tmp_path), 0))[0]) == 8
    analysis = analyse(open_run(str(tmp_path)))
    m = analysis.metrics[0]
    assert m.counted_steps == (1,)
    assert (m.wall_s, m.compute_s, m.comm_s) == pytest.approx((95 * U / 1e9, 65 * U / 1e9,
                                                               70 * U / 1e9))
    assert m.overlapped_comm_s == pytest.approx(50 * U / 1e9)
    assert m.exposed_comm_s == pytest.approx(20 * U / 1e9)
    assert m.idle_s == pytest.approx(10 * U / 1e9)
    summary = build_summary(analysis)["ranks"]["0"]
    assert summary["time"]["clock"] == "device"
    assert summary["device"]["by_op"] == {"aten.mm.default": pytest.approx(65 * U / 1e9),
                                         "c10d.allreduce_.default": pytest.approx(70 * U / 1e9),
                                         "aten.add.Tensor": pytest.approx(1 * U / 1e9)}
    (span,) = analysis.timeline.ranks[0].comm
    assert (span.start - r.t(0), span.end - r.t(0)) == (20 * U, 90 * U)
    assert Path(path).exists()


def test_chrome_trace_has_gpu_streams_and_launch_flows(fixture_run, tmp_path):
    from viz.render.report import ReportInput, timeline
    analysis = analyse(open_run(str(fixture_run)), kineto={0: (str(KINETO),)})
    timeline.render(ReportInput(analysis), str(tmp_path))
    data = json.loads((tmp_path / "timeline.json").read_text())
    events = data["traceEvents"]
    streams = {e["args"]["name"] for e in events if e["name"] == "thread_name"
               and e["args"]["name"].startswith("GPU stream")}
    assert streams == {"GPU stream 7", "GPU stream 14"}   # compute, and NCCL setup's
    gpu = [e for e in events if e.get("cat") in ("gpu", "gpu_comm", "gpu_memory")]
    assert len(gpu) == 1666
    slices: dict = {}
    for e in events:
        if e["ph"] == "X":
            slices.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    starts = {e["id"]: e for e in events if e["ph"] == "s" and e["cat"] == "launch"}
    ends = {e["id"]: e for e in events if e["ph"] == "f" and e["cat"] == "launch"}
    assert len(starts) == len(ends) > 1000
    for flow_id, s in starts.items():           # each arrow leaves an op, lands on its kernel
        f = ends[flow_id]
        assert any(a <= s["ts"] <= b for a, b in slices[(s["pid"], s["tid"])])
        assert any(a <= f["ts"] <= b for a, b in slices[(f["pid"], f["tid"])])
        assert s["ts"] <= f["ts"] + 1e-3
    assert data["otherData"]["clock"] == {"0": "device"}
    svg = (tmp_path / "timeline.svg").read_text()
    assert ">GPU 7</text>" in svg and "clock: device" in svg and 'class="gpu"' in svg


# ---------------------------------------------------------------------------- the device clock
@pytest.fixture(scope="module")
def merged(fixture_run):
    """The fixture's recording with its export merged: (analysis, summary's rank 0)."""
    analysis = analyse(open_run(str(fixture_run)), kineto={0: (str(KINETO),)})
    return analysis, build_summary(analysis)["ranks"]["0"]


def test_the_recordings_device_whole_equals_the_independent_computation(merged):
    from support import kineto_oracle
    expected = kineto_oracle.whole(kineto_oracle.load(KINETO))
    whole = merged[1]["device"]["whole"]
    assert (whole["kernels"], whole["memcpys"], whole["memsets"], whole["comm_kernels"]) == \
        (expected["kernels"], expected["memcpys"], expected["memsets"], 0) == (1158, 249, 259, 0)
    for key in ("span_s", "busy_s", "compute_s", "memory_s", "idle_s"):
        assert whole[key] == pytest.approx(expected[key], rel=1e-3), key
    # memcpys and memsets are memory, never compute: 21.03 ms of kernels, not 21.90 with them
    assert whole["compute_s"] == pytest.approx(0.02103, abs=1e-5)
    assert merged[1]["time"]["compute_s"] + merged[1]["time"]["memory_s"] > \
        merged[1]["time"]["compute_s"]


def test_a_collective_that_launched_no_nccl_kernel_is_not_device_communication(merged):
    """Step 2 of the fixture: NCCL on a world of one launched no kernel for its all_reduce and
    broadcast (copies only for all_gather and reduce_scatter): no device communication, where
    the timeline drew 14.6 ms of it. The collectives keep their host spans, marked."""
    analysis, rank = merged
    step2 = next(s for s in rank["time"]["per_step"] if s["step"] == 2)
    assert step2["comm_s"] == step2["exposed_comm_s"] == 0
    assert step2["overlap_fraction"] is None and step2["memory_s"] > 0
    spans = [c for c in analysis.timeline.ranks[0].comm if c.step == 2]
    assert sorted(c.kind for c in spans) == ["all_gather", "all_reduce", "all_reduce",
                                             "broadcast", "reduce_scatter"]
    assert all(c.on_gpu is False for c in spans)
    assert len(analysis.timeline.ranks[0].comm_union) == 0


def test_the_timeline_draws_memory_apart_and_no_device_comm_in_step_2(merged, tmp_path):
    from viz.render.report import ReportInput, timeline
    timeline.render(ReportInput(merged[0]), str(tmp_path))
    events = json.loads((tmp_path / "timeline.json").read_text())["traceEvents"]
    cats = Counter(e.get("cat") for e in events if e.get("ph") == "X")
    assert cats["gpu_memory"] == 249 + 259 and cats["gpu"] == 1158 and cats["gpu_comm"] == 0
    assert cats["comm"] == 0 and cats["comm_host"] == 5
    svg = (tmp_path / "timeline.svg").read_text()
    assert 'class="memory"' in svg and "memcpy/memset" in svg
    assert 'class="comm"' not in svg


def test_the_front_page_bar_shows_memory_apart_from_idle(merged):
    """The headline's stacked bar on the device clock: compute, exposed communication, the
    memcpys and memsets neither hid, and idle, as docs/metrics.md defines them: idle is what
    none of compute, communication and memory covers, so memory's share is the step less
    compute, exposed communication and idle, at most all the memory activity."""
    from viz.views.pages import headline_rows
    analysis, rank = merged
    time = rank["time"]
    (row,) = headline_rows(analysis)
    assert [cls for cls, _ in row["bar"]] == ["compute", "comm", "memory", "idle"]
    share = dict(row["bar"])
    wall = time["wall_s"]
    expected = wall - time["compute_s"] - time["exposed_comm_s"] - time["idle_s"]
    assert 0 < expected <= time["memory_s"] * (1 + 1e-9)
    assert share["memory"] == pytest.approx(100 * expected / wall)
    assert share["idle"] == pytest.approx(100 * time["idle_s"] / wall)
    assert sum(share.values()) == pytest.approx(100)
    assert row["memory"]


def test_the_writers_warm_up_is_a_device_stream_of_one_row_in_memory(tmp_path):
    # what the direct recorder writes at its start, so that the flusher's first batch does not
    # pay pyarrow's first-use costs: the same writer's path, into memory, no file
    data = warm_up()
    path = tmp_path / "warm.device.arrow"
    path.write_bytes(data)
    records, metas, problem = read_device(str(path))
    assert problem is None and len(records) == 1 and metas == [{}]
    assert records.names == ["warm-up"] and records.start.tolist() == [0]
    assert list(tmp_path.iterdir()) == [path]
