"""The benchmarks still run and print every line docs/ quotes (tiny settings; their numbers are
not checked here: timings are benchmarks, never tests). A session lent a GPU runs
benchmarks/overhead.py there with no time to mend it (scripts/gpu_checks.sh)."""
from __future__ import annotations

import gzip
import os
import re
import subprocess
import sys

from support.cli import CPU_ONLY
from support.paths import REPO

NUMBER = r"-?\d+\.\d+"


def _run(*args, timeout=300):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env={**os.environ, **CPU_ONLY})


def test_overhead_prints_every_recorder_and_every_target():
    proc = _run("benchmarks/overhead.py", "--rounds", "1", "--steps", "2", "--models", "tiny",
                "--reader-events", "20000")
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    recorders = ["untraced", "no-op dispatch mode", "no-op mode, no Dynamo wrapper", "paratrace",
                 "paratrace, unrecorded step", "torch.profiler", "paratrace, memory",
                 "torch.profiler, profile_memory"]
    for name in recorders:
        # wall, main-thread CPU and all-thread CPU: step, extra, extra/op each
        assert re.search(rf"^{re.escape(name)}\s+(?:{NUMBER}ms\s+{NUMBER}\s+{NUMBER}us\s+)"
                         rf"{{2}}{NUMBER}ms\s+{NUMBER}\s+{NUMBER}us$", out, re.M), (name, out)
    for clock in ("wall", "main", "cpu "):
        assert re.search(rf"^{clock}: paratrace extra / no-op mode extra\s+{NUMBER} .*"
                         rf"/ profiler extra\s+{NUMBER} .*unrecorded / untraced step\s+"
                         rf"{NUMBER}", out, re.M), (clock, out)
        assert re.search(rf"^{clock}: paratrace with memory: extra / no-op mode extra\s+"
                         rf"{NUMBER} .*/ profile_memory extra\s+{NUMBER} ", out, re.M), out
    assert re.search(rf"^paratrace extra / extra of the no-op mode without torch's Dynamo "
                     rf"wrapper: wall {NUMBER}, main {NUMBER}, cpu {NUMBER}$", out, re.M), out
    # paired within each round: median [quartiles], or '-' where the floor added nothing
    paired = rf"(?:{NUMBER} \[{NUMBER}, {NUMBER}\]|-)"
    for name, floor in (("paratrace", "no-op mode"), ("paratrace, memory", "no-op mode"),
                        ("paratrace, memory", "torch.profiler, profile_memory")):
        assert re.search(rf"^per round: {name} extra / {floor} extra, median \[quartiles\] "
                         rf"of 1 rounds: wall {paired}, main {paired}, cpu {paired}$", out,
                         re.M), (name, floor, out)
    assert re.search(rf"^bytes per event on disk: {NUMBER} \(\d+ events", out, re.M), out
    match = re.search(r"^reader: [\d,]+ events/s on a ([\d,]+)-event trace", out, re.M)
    assert match and int(match.group(1).replace(",", "")) >= 20000, out


def test_overhead_on_cuda_without_a_gpu_says_so_in_one_line():
    proc = _run("benchmarks/overhead.py", "--device", "cuda", timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines()[-1].endswith(
        "--device cuda: torch sees no CUDA GPU on this machine"), proc.stderr
    assert "Traceback" not in proc.stderr


def test_trace_write_compares_every_write_option():
    proc = _run("benchmarks/trace_write.py", "--rounds", "1", "--reps", "2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = {line.split("  ")[0]: line for line in proc.stdout.splitlines()}
    sizes = {}
    for name in ("zstd, writing thread (paratrace)", "zstd, Arrow's thread pool",
                 "lz4, writing thread", "uncompressed"):
        assert re.fullmatch(rf"{re.escape(name)}\s+{NUMBER}ms\s+{NUMBER}\s+{NUMBER}ms\s+"
                            rf"{NUMBER}", lines.get(name, "")), proc.stdout
        sizes[name] = float(lines[name].split()[-1])      # bytes an event
    # the same rows, compressed or not: compression must shrink them
    assert sizes["zstd, writing thread (paratrace)"] < sizes["uncompressed"] / 4


def test_kineto_benchmark_prints_its_lines(tmp_path):
    """benchmarks/kineto.py on 2 tiny constructed ranks (no HTA), and the parser comparison on
    a real export: every line docs/kineto.md quotes."""
    proc = _run("benchmarks/kineto.py", "--ranks", "2", "--mb", "0.5", "--hta-ranks", "0",
                "--tmp", str(tmp_path))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert re.search(r"^constructed: 2 ranks x [\d.]+ MB of JSON", proc.stdout, re.M), proc.stdout
    assert re.search(rf"^paratrace\s+wall\s+{NUMBER} s\s+{NUMBER} MB/s\s+{NUMBER} MB/s per core "
                     rf"\(cpu {NUMBER} s\)\s+peak\s+\d+ MiB largest process,\s+\d+ MiB together"
                     r"\s+exit 0$", proc.stdout, re.M), proc.stdout
    matched = re.search(r"collectives matched across ranks: ([\d,]+), unmatched 0", proc.stdout)
    assert matched and int(matched.group(1).replace(",", "")) > 0, proc.stdout
    export = tmp_path / "nccl_data.json"
    with gzip.open(os.path.join(REPO, "tests/assets/kineto-hta/nccl_data.json.gz")) as src:
        export.write_bytes(src.read())
    proc = _run("benchmarks/kineto_parsers.py", str(export), "--rounds", "1")
    assert proc.returncode == 0, proc.stderr[-2000:]
    for name in ("json.load, exact decimals (stdlib)", "raw_decode, sliding buffer (stdlib)",
                 "paratrace's reader (raw_decode + columns)"):
        assert re.search(rf"^{re.escape(name)}\s+40,573\s+{NUMBER}\s+{NUMBER}\s+\d+\s+{NUMBER}",
                         proc.stdout, re.M), (name, proc.stdout)


def test_the_whatif_benchmark_tables_medians_of_known_errors(monkeypatch):
    """benchmarks/whatif.py's recording runs take minutes (docs/whatif.md); its arithmetic is
    checked here on made-up measures: the median error over repeats, the bubble error in
    points, and the goal of the target's class."""
    monkeypatch.syspath_prepend(REPO)
    from benchmarks import whatif as bench

    def m(step_s, bubble):
        return {"step_s": step_s, "bubble_fraction": bubble}
    # three repeats of a schedule target: errors +10 %, -5 %, +2 % -> median +2.0 %
    found = {"A -> gpipe": ("schedule", [(m(1.10, 0.30), m(1.00, 0.25)),
                                         (m(0.95, 0.20), m(1.00, 0.25)),
                                         (m(2.04, 0.50), m(2.00, 0.40))]),
             # one repeat of a tensor target, 20 % long: past its 15 % goal
             "B -> tp 2+sp, dp 1": ("tensor", [(m(0.60, 0.0), m(0.50, 0.0))])}
    rows = {line[:22].strip(): line for line in bench.table(found, 3, None).splitlines()[2:]}
    gpipe = rows["A -> gpipe"].split()
    # medians: predicted 1.10 s, real 1.00 s, bubbles 0.300 / 0.250, bubble error +5.0 p
    assert gpipe[4:] == ["1100.0m", "1000.0m", "+2.0%", "0.300", "0.250", "+5.0p", "10%",
                         "yes"]
    assert rows["B -> tp 2+sp, dp 1"].split()[-6:] == ["+20.0%", "0.000", "0.000", "+0.0p",
                                                       "15%", "NO"]
    spread = bench.detail(found).splitlines()
    assert spread[1].split()[3:] == ["+10.0", "(", "+5.0)", "-5.0", "(", "-5.0)", "+2.0",
                                     "(+10.0)"]
    # a target changes only what it names; dp follows the world of 2 ranks
    assert bench.target_config(bench.BASES["A"], {"tp": 2, "pp": 1})["dp"] == 1
    assert bench.target_config(bench.BASES["B"], {"pp": 2})["dp"] == 1
    assert bench.target_config(bench.BASES["A"], {"schedule": "gpipe", "virtual_stages": 2}
                               )["virtual_stages"] == 1


def test_the_whatif_models_benchmark_tables_medians_and_worst_errors(monkeypatch):
    """benchmarks/whatif_models.py's runs take many minutes (docs/whatif.md); its arithmetic
    is checked here on made-up measures: the median and the worst error over repeats, and
    the goals (median within 10 %, worst within 20 %)."""
    monkeypatch.syspath_prepend(REPO)
    from benchmarks import whatif_models as bench

    def m(step_s):
        return {"step_s": step_s}
    found = {("llama", "FSDP2"): [(m(1.05), m(1.00)), (m(0.90), m(1.00)), (m(1.30), m(1.00))],
             ("cnn", "ZeRO-1"): [(m(0.54), m(0.50))]}
    rows = {tuple(line.split()[:2]): line.split()
            for line in bench.table(found, 3, None).splitlines()[2:]}
    # errors +5 %, -10 %, +30 %: median +5.0 %, worst +30.0 % (past 20 %)
    assert rows[("llama", "FSDP2")][2:] == ["1050.0m", "1000.0m", "+5.0%", "+30.0%", "NO"]
    assert rows[("cnn", "ZeRO-1")][2:] == ["540.0m", "500.0m", "+8.0%", "+8.0%", "yes"]
    assert bench.detail(found).splitlines()[1].split()[2:] == ["+5.0", "-10.0", "+30.0"]
    assert bench.resolved("gpt2", ["--checkpoint", "CKPT"]) == ["--checkpoint", "transformer.h.*"]


def test_the_whatif_models_benchmark_sets_pipelines_beside_real_runs(monkeypatch):
    """The pipelines' table of benchmarks/whatif_models.py on made-up measures: ratios
    predicted / real of the step (one a repeat), each rank's peak and P2P bytes (one a rank
    and repeat), each the median and the one farthest from 1; pipelines only where the model
    has a split (GPT-2 has none)."""
    monkeypatch.syspath_prepend(REPO)
    from benchmarks import whatif_models as bench

    def m(step_s, peaks, p2p):
        return {"step_s": step_s, "memory": {r: {"peak_bytes": b} for r, b in peaks.items()},
                "p2p": p2p}

    def real(step_s, peaks, p2p):
        return {"step_s": step_s, "memory": peaks, "p2p": p2p}
    found = {("llama", "pp 2 1F1B m4"): [
        (m(1.05, {"0": 110, "1": 100}, {"0": 64, "1": 64}), real(1.0, {"0": 100, "1": 100},
                                                            {"0": 64, "1": 64})),
        (m(0.90, {"0": 100, "1": 96}, {"0": 64, "1": 64}), real(1.0, {"0": 100, "1": 100},
                                                           {"0": 64, "1": 32})),
        (m(1.30, {"0": 100, "1": 100}, {"0": 64, "1": 64}), real(1.0, {"0": 100, "1": 100},
                                                            {"0": 64, "1": 64}))],
        ("llama", "FSDP2"): [(m(1.0, {}, {}), real(1.0, {}, {}))]}
    lines = bench.pipeline_table(found).splitlines()
    assert len(lines) == 3                                  # the title, the header, one row
    # steps 1.05, 0.90, 1.30; peaks 1.10, 1.00, 1.00, 0.96, 1.00, 1.00; P2P 1 five times, 2
    assert lines[2].split() == ["llama", "pp", "2", "1F1B", "m4", "1.0500", "1.3000", "1.0000",
                                "1.1000", "1.0000", "2.0000"]
    names = {name: args for name, _, args, _ in bench.targets_of("llama")}
    assert names["pp 2 interl. m4"] == ["--pp", "2", "--split", "layers.1,layers.2,layers.3",
                                        "--schedule", "interleaved", "--microbatches", "4"]
    assert not [n for n, *_ in bench.targets_of("gpt2") if n.startswith("pp")]
