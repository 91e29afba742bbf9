"""GPU work launched inside an annotation range and none of its aten ops: a compiled region's
fused kernels (inductor's Triton kernels are no aten op), a higher-order operator's, a copy
under a user's ``tracer.annotate`` range. On constructed records with known times: each launch
goes where a brute-force computation written here puts it (docs/gpu.md, "Attribution"), and the
range's kernels are shown by kernel name under the range's module and source line, not on the
nearest aten op (an H100 run of a compiled MLP put all 210 ``triton_poi_fused_gelu_0`` launches
on ``aten.zero_.default``)."""
from __future__ import annotations

import subprocess
import sys
from collections import Counter, defaultdict

import numpy as np
import pytest

import tracer
from tracer.files import rundir
from tracer.files.device_format import DeviceRecords, DeviceWriter, KINDS, read_device
from support.constructed.synthetic import SyntheticRank
from support.gpt_helpers import env
from viz.analysis import analyse
from viz.analysis.device.gpu_attribution import attribute
from viz.analysis.callgraphs.op_groups import NO_STACK, Frame
from viz.render.summary_schema import build_summary
from viz.run import open_run
from support.paths import ASSETS, REPO, SCRIPTS

OFFSET = 1_700_000_000_000_000_000        # Unix ns = the rank's clock + OFFSET
U = 1_000                                 # ns per unit
MAIN, AUTOGRAD = 7, 8                     # the host threads' idents (trace threads 0 and 1)
ANN = "paratrace::annotation"

# frames, innermost first in a stack; the sites below list them outermost first
MAIN50 = ("/src/train.py", 50, "main", "main")           # out = model(x)
MAIN52 = ("/src/train.py", 52, "main", "main")
MAIN53 = ("/src/train.py", 53, "main", "main")           # loss.backward()
MAIN54 = ("/src/train.py", 54, "main", "main")
FWD = ("/src/model.py", 10, "forward", "Net.forward")    # the compiled function
GATE = ("/src/model.py", 30, "forward", "Gate.forward")  # calls torch.cond
GEN = "/tmp/torchinductor_u/ab/cab.py"                   # inductor's generated code
GEN_BW = "/tmp/torchinductor_u/cd/ccd.py"
COMPILED = dict(source="torch.compile", graph="0/0", code="/src/model.py:10", fn="Net.forward",
                backend="inductor", module="Net")
F0 = dict(label="F", microbatch=0, chunk=0)

# (kind, name, launch time, start, end, host thread ident): the GPU activities, in units
LAUNCHES = [
    ("kernel", "gemm_a", 10, 100, 110, MAIN),                       # inside addmm.out [8, 12]
    ("kernel", "triton_poi_fused_gelu_0", 15, 111, 114, MAIN),      # compiled region, no op
    ("kernel", "gemm_b", 22, 120, 126, MAIN),                       # inside addmm.out [20, 24]
    ("kernel", "triton_poi_fused_mul_2", 27, 133, 135, MAIN),       # own region before the
    #                                                                 autograd thread's op
    ("kernel", "triton_red_fused_sum_1", 35, 127, 132, MAIN),       # compiled region, no op
    ("memset", "Memset (Device)", 42, 136, 137, MAIN),              # inside zero_ [41, 43]
    ("memcpy", "Memcpy HtoD (Pageable -> Device)", 50, 138, 140, MAIN),   # F, no op
    ("kernel", "gemm_c", 77, 141, 150, AUTOGRAD),                   # inside mm.out [75, 80]
    ("kernel", "triton_poi_fused_gelu_backward_0", 90, 151, 155, AUTOGRAD),   # backward region
    ("kernel", "cos_kernel", 103.5, 156, 157, MAIN),                # inside cos [103, 104]
    ("kernel", "triton_poi_fused_cos_0", 106, 157, 159, MAIN),      # cond's range, no op
    ("kernel", "add_kernel", 113, 159, 160, MAIN),                  # between add [110, 112]
    #                                                                 and add [120, 122]
    ("kernel", "gemm_a", 144, 171, 181, MAIN),                      # step 2: the graph again
    ("kernel", "triton_poi_fused_gelu_0", 150, 181, 185, MAIN),
    ("kernel", "triton_red_fused_sum_1", 160, 186, 190, MAIN),
]


def build(directory) -> SyntheticRank:
    """One rank, 2 threads: a compiled forward (inside a user's F range) and its compiled
    backward on the autograd thread, a torch.cond, and the same compiled graph in step 2."""
    r = SyntheticRank(0, 1, unit_ns=U, meta={
        "clock_pairs": [{"perf_ns": 1_000_000_000, "unix_ns": 1_000_000_000 + OFFSET}],
        "threads": {"0": MAIN, "1": AUTOGRAD}})
    r.op(-30, -20, name="aten.empty.memory_format")
    r.next_step(0)
    fwd = dict(COMPILED, **{"pass": "forward"})
    r.annotate("F", 0, 60, microbatch=0, chunk=0)
    r.annotate("torch.compile", 5, 40, outer=[F0], **fwd)
    inside = [F0, dict(label="torch.compile", **fwd)]
    r.op(8, 12, name="aten.addmm.out", stack=[(GEN, 90, "call", "Runner.call"), FWD, MAIN50],
         module="Net", annotation=inside)
    r.op(20, 24, name="aten.addmm.out", stack=[(GEN, 99, "call", "Runner.call"), FWD, MAIN50],
         module="Net", annotation=inside)
    r.op(26, 28, name="aten.add_.Tensor", phase="backward", thread=1, stack=[MAIN53])
    r.op(41, 43, name="aten.zero_.default", stack=[MAIN52], annotation=[F0])
    r.op(52, 55, name="aten.mul.Tensor", stack=[MAIN52], annotation=[F0])
    bwd = dict(COMPILED, **{"pass": "backward"})
    r.annotate("torch.compile", 70, 100, thread=1, **bwd)
    r.op(75, 80, name="aten.mm.out", phase="backward", thread=1, module="Net",
         stack=[(GEN_BW, 151, "call", "Runner.call"), MAIN53],
         annotation=[dict(label="torch.compile", **bwd)])
    r.annotate("higher_order.cond", 102, 108, stack=[GATE, MAIN54], row_module="Net.gate",
               source="higher_order", hop="cond", module="Net.gate", code="/src/model.py:30")
    r.op(103, 104, name="aten.cos.default", stack=[("/src/model.py", 31, "<lambda>",
                                                     "Gate.forward.<locals>.<lambda>"),
                                                    GATE, MAIN54], module="Net.gate")
    r.op(110, 112, name="aten.add.Tensor", stack=[MAIN54])
    r.op(120, 122, name="aten.add.Tensor", stack=[MAIN54])
    r.next_step(130)
    r.annotate("torch.compile", 140, 170, **fwd)
    r.op(142, 146, name="aten.addmm.out", stack=[(GEN, 90, "call", "Runner.call"), FWD, MAIN50],
         module="Net", annotation=[dict(label="torch.compile", **fwd)])
    r.next_step(200)
    r.op(201, 202, name="aten.add.Tensor", stack=[MAIN54])
    r.write(directory)
    names = sorted({name for _, name, *_ in LAUNCHES})
    rows = []
    for corr, (kind, name, launch, start, end, ident) in enumerate(LAUNCHES):
        rows.append((KINDS.index("runtime"), names.index(name), launch, launch, -1, corr,
                     ident, -1))
        rows.append((KINDS.index(kind), names.index(name), start, end, 7, corr, -1, -1))
    cols = np.array([(k, n, OFFSET + r.t(a), OFFSET + r.t(b), 0, stream, corr, tid, -1)
                     for k, n, a, b, stream, corr, tid, _ in rows], dtype=np.int64)
    device = DeviceWriter(rundir.device_file(str(directory), 0), {"rank": 0})
    device.write(DeviceRecords(*(cols[:, i] for i in range(9)), names=names), {"window": 0})
    device.close()
    return r


def oracle(trace) -> list:
    """Per launch of LAUNCHES, (how, row) by brute force over the trace's rows: the innermost
    (latest-started) event holding it on its own thread, else the innermost range on its own
    thread, else the same over every thread; else the nearer of the events around it."""
    ops, code = trace.dictionary("op"), trace.col("op")
    rows = [(i, ops[c], int(a), int(b), int(th)) for i, (c, a, b, th) in enumerate(zip(
        code.tolist(), trace.col("t0").tolist(), trace.col("t1").tolist(),
        trace.col("thread").tolist())) if not ops[c].startswith("paratrace::") or ops[c] == ANN]
    thread_of = {int(v): int(k) for k, v in trace.meta["threads"].items()}
    out = []
    for _, _, launch, _, _, ident in LAUNCHES:
        t = 1_000_000_000 + int(round(launch * U))
        found = None
        for thread in (thread_of[ident], None):
            for how, ranges in (("inside", False), ("region", True)):
                held = [(a, i) for i, op, a, b, th in rows if (op == ANN) == ranges
                        and a <= t <= b and thread in (None, th)]
                if held and found is None:
                    found = (how, max(held)[1])
        if found is None:
            events = sorted((a, b, i) for i, op, a, b, _ in rows if op != ANN)
            before = max(e for e in events if e[0] <= t)
            after = min(e for e in events if e[0] > t)
            found = ("between", before[2] if t - before[1] <= after[0] - t else after[2])
        out.append(found)
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    directory = tmp_path_factory.mktemp("regions")
    build(directory)
    trace = tracer.load(rundir.trace_file(str(directory), 0))
    analysis = analyse(open_run(str(directory)))
    return trace, analysis, build_summary(analysis)["ranks"]["0"]


def test_each_launch_goes_where_the_brute_force_puts_it(run):
    trace, analysis, rank = run
    records, _, _ = read_device(rundir.device_file(str(analysis.run.dir), 0))
    dev = attribute(trace, records)
    how = {0: "inside", 2: "between", 3: "region"}
    assert [(how[h], r) for h, r in zip(dev.how.tolist(), dev.row.tolist())] == oracle(trace)
    ops, op = trace.dictionary("op"), trace.col("op")
    owner = [ops[op[r]] for r in dev.row.tolist()]
    # by construction: the fused kernels belong to the compiled ranges, not to zero_ after them
    assert owner[1] == owner[4] == owner[8] == owner[13] == ANN
    assert owner[5] == "aten.zero_.default" and owner[11] == "aten.add.Tensor"
    assert owner[3] == ANN                  # its own thread's range before another's op
    assert rank["device"]["attributed_by"] == {
        "inside_an_event": 6, "inside_a_region": 8, "process_group_setup": 0,
        "between_events": 1}
    assert rank["device"]["attributed"] == rank["device"]["activities"] == len(LAUNCHES)


def test_device_time_by_op_names_a_ranges_kernels(run):
    """summary.json's by_op: a range's own GPU work by kernel name; zero_ keeps its memset."""
    _, _, rank = run
    want: dict = defaultdict(float)
    owners = {"gemm_a": "aten.addmm.out", "gemm_b": "aten.addmm.out", "gemm_c": "aten.mm.out",
              "Memset (Device)": "aten.zero_.default", "cos_kernel": "aten.cos.default",
              "add_kernel": "aten.add.Tensor"}
    for _, name, _, start, end, _ in LAUNCHES:
        want[owners.get(name, name)] += (end - start) * U / 1e9
    assert rank["device"]["by_op"] == pytest.approx(dict(want))
    assert rank["device"]["by_op"]["aten.zero_.default"] == pytest.approx(1 * U / 1e9)


def sites() -> dict:
    """kernel name -> (path outermost first, module, phase) where the report shows it, by
    construction: a compiled region's kernels at the compiled function called from its call
    line (the frames its ops' lines share, down to the function the range names), its backward
    at the backward() line; cond's at the row's own stack; the F range's (its ops share no
    frame, no code is named) nowhere."""
    compiled = (tuple(Frame(*f) for f in (MAIN50, FWD)), "Net", "forward")
    return {"triton_poi_fused_gelu_0": compiled, "triton_red_fused_sum_1": compiled,
            "triton_poi_fused_mul_2": compiled,
            "triton_poi_fused_gelu_backward_0": ((Frame(*MAIN53),), "Net", "backward"),
            "triton_poi_fused_cos_0": ((Frame(*MAIN54), Frame(*GATE)), "Net.gate", "forward"),
            "Memcpy HtoD (Pageable -> Device)": ((NO_STACK,), None, "forward")}


def test_a_ranges_kernels_are_op_groups_under_its_module_and_line(run):
    trace, analysis, _ = run
    where = sites()
    for groups, steps in ((analysis.ranks[0].op_groups, (0, 1, 2, 3)),
                          (analysis.ranks[0].counted_op_groups, (1, 2))):
        want: dict = defaultdict(lambda: [0, 0])
        for _, name, launch, start, end, _ in LAUNCHES:
            step = 1 if launch < 130 else 2
            if name in where and step in steps:
                want[(name,) + where[name]][0] += 1
                want[(name,) + where[name]][1] += (end - start) * U
        got = {(g.op, g.path, g.module, g.phase): [g.count, g.time_ns] for g in groups
               if g.op in where}
        assert got == want
        # the ops themselves are still there, with their own kernels' time
        zero = [g for g in groups if g.op == "aten.zero_.default"]
        assert [(g.count, g.time_ns) for g in zero] == [(1, 1 * U)]
    assert analysis.ranks[0].counted_steps == (1, 2)


def test_the_front_page_lists_the_fused_kernel_at_the_compiled_line(run):
    from viz.views.pages import top_ops
    _, analysis, _ = run
    rows = top_ops(analysis.ranks[0].counted_op_groups, comm=False, paths={},
                   href=lambda file, line: None, n=20)
    gelu = next(r for r in rows if r["full"] == "triton_poi_fused_gelu_0")
    assert (gelu["where"], gelu["qualname"], gelu["w"].ops) == ("model.py:10", "Net.forward", 2)
    assert gelu["w"].time_ns == (114 - 111 + 185 - 181) * U


# ------------------------------------------------------------------ a real torch.compile run
SCRIPT = SCRIPTS / "compiled_mlp.py"


def marked_line(marker: str) -> int:
    return next(i + 1 for i, text in enumerate(SCRIPT.read_text().splitlines())
                if marker in text)


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """The compiled MLP traced for real on the CPU (``trace-run --no-launcher``), and GPU
    activity added as a GPU run would have it: in each range of the recording, a kernel
    launched before its first op (inductor's fused kernels are no aten op)."""
    out = tmp_path_factory.mktemp("compiled") / "run"
    environment = {k: v for k, v in env().items()
                   if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    proc = subprocess.run([sys.executable, "-m", "instrument.launch", "--no-launcher",
                           "--no-report", "--out", str(out), str(SCRIPT), "3"], cwd=REPO,
                          env=environment, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    traces = out / "traces"
    trace = tracer.load(rundir.trace_file(str(traces), 0))
    ops, code = trace.dictionary("op"), trace.col("op")
    t0, t1, thread = trace.col("t0"), trace.col("t1"), trace.col("thread")
    ident = {int(k): int(v) & 0xFFFFFFFF for k, v in trace.meta["threads"].items()}
    pairs = trace.meta["clock_pairs"]
    off0 = pairs[0]["unix_ns"] - pairs[0]["perf_ns"]
    drift = (pairs[-1]["unix_ns"] - pairs[-1]["perf_ns"]) - off0
    span = pairs[-1]["unix_ns"] - pairs[0]["unix_ns"]

    def unix(t: int) -> int:              # the rank's clock -> Unix ns (the clock pairs)
        return t + off0 + round(drift * (t + off0 - pairs[0]["unix_ns"]) / span)
    launches = []                         # (range row, kernel name, launch time, thread ident)
    for r in np.nonzero(code == trace.code("op", ANN))[0].tolist():
        label = trace.annotation(int(trace.col("annotation")[r]))[-1]
        if label.get("label", "").endswith(" (dynamo_timed)"):
            continue          # torch 2.10's Dynamo's compile steps, inside the first call
        # before the range's first op and first nested range (those compile steps)
        first = min([t0[i] for i in range(len(code)) if i != r and thread[i] == thread[r] and
                     t0[r] <= t0[i] <= t1[r]] + [t1[r]])
        name = {"forward": "triton_poi_fused_gelu_0",
                "backward": "triton_poi_fused_gelu_backward_0"}.get(
            label.get("pass"), "Memcpy HtoD (Pageable -> Device)")
        launches.append((r, name, int(t0[r] + (first - t0[r]) // 2), ident[int(thread[r])]))
    names = sorted({n for _, n, _, _ in launches})
    rows = []
    for corr, (_, name, t, tid) in enumerate(launches):
        kind = "memcpy" if name.startswith("Memcpy") else "kernel"
        rows.append((KINDS.index("runtime"), names.index(name), unix(t), unix(t), 0, -1, corr,
                     tid, -1))
        rows.append((KINDS.index(kind), names.index(name), unix(t) + 1_000, unix(t) + 3_000, 0,
                     7, corr, -1, -1))
    device = DeviceWriter(rundir.device_file(str(traces), 0), {"rank": 0})
    device.write(DeviceRecords(*np.array(rows, dtype=np.int64).T, names=names), {"window": 0})
    device.close()
    return trace, launches, analyse(open_run(str(out)))


def test_a_real_compiled_regions_kernels_land_on_its_range_and_lines(compiled):
    """Each added launch lies in its range and in none of the recording's ops (checked here by
    brute force); the report shows the forward's kernels at the compiled forward called from
    its line, the backward's at the backward() line, both on the MLP; the optimizer's copy
    at opt.step()."""
    trace, launches, analysis = compiled
    ops, code = trace.dictionary("op"), trace.col("op")
    t0, t1 = trace.col("t0"), trace.col("t1")
    for r, _, t, _ in launches:
        assert t0[r] < t < t1[r]
        assert not any(t0[i] <= t <= t1[i] for i, c in enumerate(code.tolist())
                       if not ops[c].startswith("paratrace::"))
    rank = build_summary(analysis)["ranks"]["0"]["device"]
    assert rank["attributed_by"]["inside_a_region"] == len(launches) == rank["activities"]
    passes = Counter(name for _, name, _, _ in launches)
    assert passes["triton_poi_fused_gelu_0"] == passes["triton_poi_fused_gelu_backward_0"] == 3
    script = str(SCRIPT)
    line = {marker: Frame(script, marked_line(marker), "main", "main") for marker in
            ("# the forward's call", "# the backward's call", "opt.step()")}
    top = Frame(script, marked_line('main(int(sys.argv[1])'), "<module>", "<module>")
    forward = Frame(script, marked_line("# the compiled function"), "forward", "MLP.forward")
    want = {("triton_poi_fused_gelu_0", (top, line["# the forward's call"], forward), "MLP",
             "forward"): 3,
            ("triton_poi_fused_gelu_backward_0", (top, line["# the backward's call"]), "MLP",
             "backward"): 3}
    got = {(g.op, g.path, g.module, g.phase): g.count for g in analysis.ranks[0].op_groups
           if g.op.startswith("triton_")}
    assert got == want
    # the optimizer's record_function ranges: step()'s ops share the opt.step() line;
    # zero_grad(set_to_none) ran no op, and the trace holds no stack for its range
    copies = {(g.path, g.phase): g.count for g in analysis.ranks[0].op_groups
              if g.op.startswith("Memcpy")}
    assert copies == {((top, line["opt.step()"]), "optimizer"): 3,
                      ((NO_STACK,), "optimizer"): 3}


# --------------------------------------------------------------- a real recording on an H100
H100_COMPILED = ASSETS / "gpu-h100-recorder" / "compiled" / "traces"


def test_an_h100_recording_gives_every_triton_kernel_to_its_compiled_region():
    """tests/assets/gpu-h100-recorder: torch.compile'd MLP blocks on an H100. Inductor's Triton
    kernels are launched by generated code, never by an aten op: each one belongs to the
    torch.compile range it ran in. Before, 210 triton_poi_fused_gelu_0 launches were given to
    aten.zero_ as the nearer event."""
    from tracer.files.device_format import KINDS
    from viz.analysis.device.gpu_attribution import IN_REGION, attribute
    trace = tracer.load(H100_COMPILED / "rank-0.arrow")
    records, _, problem = read_device(str(H100_COMPILED / "rank-0.device.arrow"))
    assert problem is None
    device = attribute(trace, records)
    names = [device.names[n] for n in device.name]
    kernel = device.kind == KINDS.index("kernel")
    triton = np.array([k and n.startswith("triton_") for k, n in zip(kernel, names)])
    # counted from the device file's own kernel names, apart from the attribution
    assert triton.sum() == sum(1 for n, k in zip(records.name, records.kind)
                               if k == KINDS.index("kernel")
                               and records.names[n].startswith("triton_")) > 200
    assert (device.how[triton] == IN_REGION).all()
    rows = trace.records()
    for row in set(device.row[triton].tolist()):
        assert rows[row]["op"] == "paratrace::annotation"
        assert rows[row]["annotation"][-1]["source"] == "torch.compile"
    zero = {i for i, e in enumerate(rows) if e["op"] == "aten.zero_.default"}
    on_zero = {names[i] for i in range(len(device)) if device.row[i] in zero}
    assert on_zero and not any(n.startswith("triton_") for n in on_zero)
