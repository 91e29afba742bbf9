"""Benchmark: torch.profiler exports analysed by paratrace, beside Holistic Trace Analysis.

    python benchmarks/kineto.py                          # 64 constructed ranks, 100 MB each
    python benchmarks/kineto.py --ranks 8 --mb 20        # smaller
    python benchmarks/kineto.py --public DIR             # every export in DIR (HTA's tests/data)

Constructed: a data-parallel NCCL job (benchmarks/kineto_exports.py), generated into a
temporary directory, analysed by ``trace-report OUT --kineto DIR`` (every analysis, summary.json
and the whole report; worker processes as trace-report chooses, ``--jobs`` to set them). Public:
each export on its own, ``--jobs 1``, the analysis alone (what HTA does: import, every
analysis, summary.json) and, once, the whole trace-report with its pages; the median of
``--rounds`` runs by CPU time; its ``device.whole`` beside the independent computation of
tests/support/kineto_oracle.py and HTA's numbers on the same file.

Every run is a fresh process tree under a child subreaper that reaps all of it: wall time;
CPU time of all its processes, workers and graphviz included (MB/s per core = JSON MB / CPU
seconds, which a loaded machine changes less than wall time); the peak resident memory of its
largest process (the kernel's, when reaped) and the largest sum over its processes at one
time (sampled every 20 ms with psutil). HTA
(``pip install holistictraceanalysis==0.5.0``, an optional benchmark dependency:
``pip install 'paratrace[bench]'``) runs where it is importable by ``--hta-python`` (default:
this interpreter): TraceAnalysis on the file's directory, then its temporal breakdown,
communication/computation overlap and kernel breakdown.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "tests"))

from support import kineto_oracle
from benchmarks.kineto_exports import write_rank  # noqa: E402

_HTA = """
import json, sys, warnings
warnings.filterwarnings("ignore")
import logging; logging.disable(logging.CRITICAL)
from hta.trace_analysis import TraceAnalysis
a = TraceAnalysis(trace_dir=sys.argv[1])
out = {}
for rank in a.t.get_ranks():
    t = a.t.get_trace(rank)
    cats = a.t.symbol_table.get_sym_table()
    names = t["cat"].map(lambda c: cats[c] if 0 <= c < len(cats) else "")
    out[str(rank)] = {"kernels": int(names.isin(["kernel", "Kernel"]).sum()),
                      "memcpys": int(names.isin(["gpu_memcpy", "Memcpy"]).sum()),
                      "memsets": int(names.isin(["gpu_memset", "Memset"]).sum()),
                      "negative_durations": int((t["dur"] < 0).sum())}
for name, call in (("temporal", lambda: a.get_temporal_breakdown(visualize=False)),
                   ("overlap", lambda: a.get_comm_comp_overlap(visualize=False)),
                   ("kernels", lambda: a.get_gpu_kernel_breakdown(visualize=False)[0])):
    try:
        frame = call()
        out["_" + name] = [{k: ("NaN" if isinstance(v, float) and v != v else v)
                            for k, v in row.items()} for row in frame.to_dict("records")]
    except Exception as exc:
        out["_" + name] = f"{type(exc).__name__}: {str(exc)[:120]}"
print(json.dumps(out, default=lambda v: v.item() if hasattr(v, "item") else str(v)))
"""


# Runs a command as a child subreaper, so every process it starts is reaped here, orphans too
# (a forkserver's workers): RUSAGE_CHILDREN then holds the CPU time of them all and the peak
# resident memory of the largest.
_REAPER = """
import ctypes, json, os, resource, subprocess, sys
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)          # PR_SET_CHILD_SUBREAPER
code = subprocess.call(sys.argv[1:])
while True:
    try:
        os.wait()
    except ChildProcessError:
        break
u = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"code": code, "cpu": u.ru_utime + u.ru_stime, "peak": u.ru_maxrss * 1024}),
      file=sys.stderr)
"""


def measure(cmd: list, env: dict = None) -> dict:
    """Run ``cmd`` (a fresh process tree); its wall and CPU seconds (every process of it),
    the peak of its largest process, the largest sum over its processes at one time, its
    output."""
    import psutil
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", _REAPER, *cmd], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=REPO,
                            start_new_session=True)
    root = psutil.Process(proc.pid)
    together = 0
    while proc.poll() is None:
        total = 0
        try:
            tree = root.children(recursive=True)
        except psutil.Error:
            tree = []
        for p in tree:
            try:
                total += p.memory_info().rss
            except psutil.Error:
                continue
        together = max(together, total)
        time.sleep(0.02)
    out, err = proc.communicate()
    wall = time.perf_counter() - start
    lines = err.rstrip().splitlines()
    usage = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else \
        {"code": proc.returncode, "cpu": 0.0, "peak": 0}
    return {"code": usage["code"], "wall": wall, "cpu": usage["cpu"], "peak": usage["peak"],
            "together": max(together, usage["peak"]), "out": out,
            "err": "\n".join(lines[:-1])}


# the analysis alone, as HTA's is: import, every analysis, summary.json (no HTML report)
_ANALYSIS = """
import sys
from viz.analysis import analyse
from viz.engine import Engine
from tracer.kineto.imported_run import import_exports
from viz.run import open_run
from viz.render.report import ReportInput, summary_json
out, jobs = sys.argv[1], None if sys.argv[2] == "-" else int(sys.argv[2])
with Engine(jobs) as engine:
    import_exports(out, sys.argv[3:], engine)
    summary_json.render(ReportInput(analyse(open_run(out), engine)), out)
"""


def paratrace(exports: list, out: str, jobs: str = None, report: bool = True) -> dict:
    """trace-report OUT --kineto EXPORTS (``report``), or the analysis alone."""
    shutil.rmtree(out, ignore_errors=True)
    if report:
        cmd = [sys.executable, "-m", "viz.cli", out, "--kineto", *exports]
        cmd += ["--jobs", jobs] if jobs else []
    else:
        cmd = [sys.executable, "-c", _ANALYSIS, out, jobs or "-", *exports]
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = measure(cmd, env)
    summary = os.path.join(out, "summary.json")
    result["summary"] = json.load(open(summary)) if os.path.exists(summary) else None
    return result


def hta(directory: str, python: str) -> dict:
    result = measure([python, "-c", _HTA, directory])
    try:
        result["numbers"] = json.loads(result["out"].strip().splitlines()[-1])
    except (ValueError, IndexError):
        lines = [x for x in result["err"].strip().splitlines() if x.strip()]
        result["numbers"] = {"error": lines[-1][:160] if lines else f"exit {result['code']}"}
    return result


def hta_runs(python: str) -> bool:
    return subprocess.run([python, "-c", "import hta.trace_analysis"],
                          capture_output=True).returncode == 0


def json_bytes(path: str) -> int:
    if not path.endswith(".gz"):
        return os.path.getsize(path)
    with gzip.open(path, "rb") as fh:
        return sum(len(chunk) for chunk in iter(lambda: fh.read(1 << 22), b""))


def _mb(n: float) -> str:
    return f"{n / 1e6:.1f}"


def _line(label: str, r: dict, mb: float) -> str:
    return (f"{label:10s} wall {r['wall']:7.2f} s  {mb / r['wall']:6.1f} MB/s  "
            f"{mb / max(r['cpu'], 1e-9):6.1f} MB/s per core (cpu {r['cpu']:.1f} s)  peak "
            f"{r['peak'] / 2**20:6.0f} MiB largest process, {r['together'] / 2**20:6.0f} MiB "
            f"together  exit {r['code']}")


# ---------------------------------------------------------------------------- constructed
def constructed(args) -> int:
    tmp = tempfile.mkdtemp(prefix="paratrace-kineto-", dir=args.tmp)
    try:
        exports = os.path.join(tmp, "exports")
        os.makedirs(exports)
        t = time.perf_counter()
        with ProcessPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            sizes = list(pool.map(write_rank, [os.path.join(exports, f"rank-{r}.json")
                                               for r in range(args.ranks)],
                                  range(args.ranks), [args.ranks] * args.ranks,
                                  [args.mb] * args.ranks))
        total = sum(sizes)
        print(f"constructed: {args.ranks} ranks x {_mb(max(sizes))} MB of JSON ({_mb(total)} MB"
              f" in all) in {time.perf_counter() - t:.0f} s; largest file {_mb(max(sizes))} MB")
        r = paratrace([exports], os.path.join(tmp, "report"), args.jobs)
        print(_line("paratrace", r, total / 1e6))
        if r["summary"]:
            cross = r["summary"]["cross_rank"]
            print(f"  collectives matched across ranks: {cross['matched']:,}, unmatched "
                  f"{cross['unmatched']}; peak largest process / largest file: "
                  f"{r['peak'] / max(sizes):.2f}x")
        else:
            print("  " + r["err"][-1500:])
        if args.hta_ranks and hta_runs(args.hta_python):
            subset = os.path.join(tmp, "hta")
            os.makedirs(subset)
            for rank in range(min(args.hta_ranks, args.ranks)):
                os.link(os.path.join(exports, f"rank-{rank}.json"),
                        os.path.join(subset, f"rank-{rank}.json"))
            n = min(args.hta_ranks, args.ranks)
            mb = sum(sizes[:n]) / 1e6
            h = hta(subset, args.hta_python)
            print(_line(f"HTA ({n} r)", h, mb))
            p = paratrace([subset], os.path.join(tmp, "report-subset"), args.jobs)
            print(_line(f"paratrace ({n} r)", p, mb))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


# ---------------------------------------------------------------------------- public exports
WHOLE = ("kernels", "memcpys", "memsets", "comm_kernels", "busy_s", "compute_s", "comm_s",
         "memory_s", "idle_s", "overlap_fraction")


def public(args) -> int:
    files = sorted(os.path.join(args.public, n) for n in os.listdir(args.public)
                   if n.endswith((".json", ".json.gz")))
    run_hta = hta_runs(args.hta_python)
    rows = []
    tmp = tempfile.mkdtemp(prefix="paratrace-public-", dir=args.tmp)
    try:
        for path in files:
            rows.append(_one_public(path, tmp, run_hta, args.hta_python, args.rounds))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(rows, indent=1) if args.json else "")
    for row in rows:
        print(_public_text(row))
    print()
    print(markdown(rows))
    return 0


def _median(runs: list) -> dict:
    """The run of median CPU time (its wall time, memory, output kept together)."""
    return sorted(runs, key=lambda r: r["cpu"])[len(runs) // 2]


def _one_public(path: str, tmp: str, run_hta: bool, python: str, rounds: int) -> dict:
    name = os.path.basename(path)
    mb = json_bytes(path) / 1e6
    row = {"export": name, "json_mb": round(mb, 2)}
    try:
        expected = kineto_oracle.whole(kineto_oracle.load(path))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        expected = {"error": f"{type(exc).__name__}"}
    row["oracle"] = expected
    a = _median([paratrace([f"0={path}"], os.path.join(tmp, "a", name), "1", report=False)
                 for _ in range(rounds)])
    r = paratrace([f"0={path}"], os.path.join(tmp, "p", name), "1")
    ranks = [v for v in (r["summary"] or {}).get("ranks", {}).values() if v["status"] == "ok"]
    row["paratrace"] = {"wall_s": round(a["wall"], 2), "cpu_s": round(a["cpu"], 2),
                        "peak_mib": round(a["peak"] / 2**20),
                        "report_wall_s": round(r["wall"], 2), "report_cpu_s": round(r["cpu"], 2),
                        "report_peak_mib": round(r["peak"] / 2**20),
                        "exit": r["code"], "error": r["err"].strip()[-200:] if r["code"]
                        else None,
                        "whole": (ranks[0].get("device") or {}).get("whole") if ranks else None}
    if run_hta:
        d = os.path.join(tmp, "h", name)
        os.makedirs(d)
        os.link(path, os.path.join(d, name)) if os.stat(path).st_dev == os.stat(d).st_dev \
            else shutil.copy(path, d)
        h = _median([hta(d, python) for _ in range(rounds)])
        row["hta"] = {"wall_s": round(h["wall"], 2), "cpu_s": round(h["cpu"], 2),
                      "peak_mib": round(h["peak"] / 2**20), "exit": h["code"],
                      "numbers": h["numbers"]}
    return row


def _public_text(row: dict) -> str:
    p, o = row["paratrace"], row["oracle"]
    whole = p["whole"]
    same = "no GPU activity" if whole is None and not o.get("kernels") else \
        "equal" if whole and all(_close(whole[k], o[k]) for k in WHOLE) else "DIFFERENT"
    if p["exit"]:      # summary.json comes first: a report that failed after it is no pass
        same += f"; the report FAILED: {p['error']}"
    text = (f"{row['export'][:44]:44s} {row['json_mb']:6.2f} MB  paratrace {p['wall_s']:5.2f} s "
            f"(cpu {p['cpu_s']:5.2f}) {p['peak_mib']:4d} MiB; with report {p['report_wall_s']:5.2f}"
            f" s {p['report_peak_mib']:4d} MiB; exit {p['exit']}  whole vs oracle: {same}")
    if "hta" in row:
        h = row["hta"]
        numbers = h["numbers"]
        failed = [k.strip("_") + ": " + v for k, v in numbers.items()
                  if isinstance(v, str)] if "error" not in numbers else [numbers["error"]]
        text += f"  | HTA {h['wall_s']:5.2f} s (cpu {h['cpu_s']:5.2f}) {h['peak_mib']:4d} MiB " + (
            "ok" if not failed and h["exit"] == 0 else "FAILED " + "; ".join(failed)[:160])
    return text


def markdown(rows: list) -> str:
    """The side-by-side table of docs/kineto.md: the independent computation (= paratrace's
    device.whole, or the difference), HTA's numbers, the analysis time of each (CPU s)."""
    out = ["| export | JSON MB | kernels / memcpys / memsets | busy ms | compute ms | comm ms "
           "| memory ms | overlap | paratrace s | HTA s |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        o, p, h = row["oracle"], row["paratrace"], (row.get("hta") or {}).get("numbers") or {}
        if not o.get("kernels") and not o.get("memcpys") and not o.get("memsets"):
            continue
        whole = p["whole"] or {}
        same = all(_close(whole.get(k), o[k]) for k in WHOLE) and not p["exit"]
        rank = next((v for k, v in h.items() if not k.startswith("_") and k != "error"), {})
        temporal = (h.get("_temporal") or [{}])[0] if isinstance(h.get("_temporal"), list) \
            else {}
        kinds = {r["kernel_type"]: r["sum"] for r in h.get("_kernels") or []
                 if isinstance(h.get("_kernels"), list)}
        overlap = (h.get("_overlap") or [{}])[0] if isinstance(h.get("_overlap"), list) else {}
        ms = lambda key: f"{o[key] * 1e3:.3f}"                       # noqa: E731
        hta_busy = (temporal.get("compute_time(us)", 0) + temporal.get("non_compute_time(us)",
                                                                          0)) / 1e3
        out.append(
            f"| {row['export'][:40]} | {row['json_mb']} | {o['kernels']} / {o['memcpys']} / "
            f"{o['memsets']}; HTA {rank.get('kernels', '-')} / {rank.get('memcpys', '-')} / "
            f"{rank.get('memsets', '-')} | {ms('busy_s')}; HTA {hta_busy:.3f} | "
            f"{ms('compute_s')}; HTA {kinds.get('COMPUTATION', 0) / 1e3:.3f} | {ms('comm_s')}; "
            f"HTA {kinds.get('COMMUNICATION', 0) / 1e3:.3f} | {ms('memory_s')}; HTA "
            f"{kinds.get('MEMORY', 0) / 1e3:.3f} | "
            f"{_pct(o['overlap_fraction'])}; HTA {overlap.get('comp_comm_overlap_pctg', '-')} | "
            f"{p['cpu_s']:.2f}{'' if same else ' (DIFFERENT or FAILED)'} | "
            f"{(row.get('hta') or {}).get('cpu_s', '-')} |")
    return "\n".join(out)


def _pct(x) -> str:
    return "null" if x is None else f"{100 * x:.1f}%"


def _close(a, b) -> bool:
    if a is None or b is None or isinstance(b, int):
        return a == b
    return abs(a - b) <= 1e-3 * max(abs(b), 1e-12)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--mb", type=float, default=100.0, help="MB of JSON a rank")
    parser.add_argument("--jobs", default=None, help="trace-report --jobs (default: its own)")
    parser.add_argument("--public", metavar="DIR", help="benchmark every export in DIR instead")
    parser.add_argument("--json", action="store_true", help="--public: print the rows as JSON")
    parser.add_argument("--rounds", type=int, default=3,
                        help="--public: runs of each tool on each export (the median is kept)")
    parser.add_argument("--hta-python", default=sys.executable,
                        help="a Python with holistictraceanalysis installed")
    parser.add_argument("--hta-ranks", type=int, default=2,
                        help="constructed: ranks HTA analyses beside paratrace (0: none)")
    parser.add_argument("--tmp", default=None, help="where to generate (default: $TMPDIR)")
    args = parser.parse_args(argv)
    return public(args) if args.public else constructed(args)


if __name__ == "__main__":
    sys.exit(main())
