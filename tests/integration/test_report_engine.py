"""Where the per-rank analysis runs does not change what it finds: in this process, in worker
processes (--jobs), on a Dask cluster (--dask, a real local cluster started here). And the
analysis of a constructed pipeline run measures the bubble it was built with, exactly."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from support.constructed.workloads import Pipeline, pipeline_run
from viz.analysis import analyse
from viz.engine import Engine
from viz.run import open_run

CFG = Pipeline(pp=2, dp=2, steps=4, microbatches=6, ops_per_pass=12)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("engine")
    pipeline_run(str(root / "traces"), CFG)
    return str(root)


def report(run: str, out, *options: str, cwd=None) -> dict:
    command = os.path.join(os.path.dirname(sys.executable), "trace-report")
    proc = subprocess.run([command if os.path.exists(command) else shutil.which("trace-report"),
                           run, "--out", str(out), *options], capture_output=True, text=True,
                          timeout=300, cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(out / "index.html")
    return json.loads((out / "summary.json").read_text())


def test_constructed_pipeline_bubble_is_measured_exactly(run):
    analysis = analyse(open_run(run))
    assert sorted(analysis.ranks) == [0, 1, 2, 3]
    for rank, m in analysis.metrics.items():
        assert m.counted_steps == (1, 2, 3)
        assert m.pipeline.bubble_fraction == pytest.approx(CFG.theoretical_bubble, abs=1e-12)
        assert m.pipeline.simulated_bubble_fraction == pytest.approx(CFG.theoretical_bubble,
                                                                     abs=1e-12)
        assert m.theoretical_bubble_fraction == pytest.approx(CFG.theoretical_bubble)
    # each pipeline (one per DP replica) matched its own messages: F and B per micro-batch
    assert len(analysis.timeline.links) == CFG.dp * (CFG.pp - 1) * 2 * CFG.microbatches * 4


def test_worker_processes_find_what_one_process_finds(run, tmp_path):
    one = report(run, tmp_path / "one", "--jobs", "1")
    two = report(run, tmp_path / "two", "--jobs", "2")
    assert one == two
    # the data-parallel replicas of a stage ran the same ops: one call graph per stage
    for out in ("one", "two"):
        assert sorted(p.name for p in (tmp_path / out / "callgraphs").glob("rank-*.html")) \
            == ["rank-0.html", "rank-2.html"]


def test_a_dask_cluster_finds_what_one_process_finds(run, tmp_path):
    from dask.distributed import LocalCluster
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster:
        on_dask = report(run, tmp_path / "dask", "--dask", cluster.scheduler_address)
        with Engine(dask=cluster.scheduler_address) as engine:
            assert engine.map(len, [("ab",), ("abc",)]) == [2, 3]   # ran on the cluster
    assert on_dask == report(run, tmp_path / "local", "--jobs", "1")


def test_a_relative_run_directory_reaches_the_dask_workers(run, tmp_path):
    """trace-report RUN --dask with RUN relative to where trace-report runs: the workers run
    in a directory of their own (this process's, not trace-report's), so the trace files
    they are handed must not be relative to trace-report's."""
    from dask.distributed import LocalCluster
    parent, name = os.path.split(run)
    assert os.path.realpath(os.getcwd()) != os.path.realpath(parent)
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster:
        on_dask = report(name, tmp_path / "dask", "--dask", cluster.scheduler_address,
                         cwd=parent)
    assert on_dask == report(run, tmp_path / "local", "--jobs", "1")


def test_an_unreachable_dask_scheduler_is_one_line_and_exit_2(run, tmp_path):
    command = os.path.join(os.path.dirname(sys.executable), "trace-report")
    proc = subprocess.run([command, run, "--out", str(tmp_path), "--dask",
                           "tcp://127.0.0.1:9"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.startswith("trace-report: error: --dask tcp://127.0.0.1:9: no scheduler "
                                  "answered") and proc.stderr.count("\n") == 1, proc.stderr


def test_a_dask_address_without_a_port_is_one_line_and_exit_2(run, tmp_path):
    command = os.path.join(os.path.dirname(sys.executable), "trace-report")
    proc = subprocess.run([command, run, "--out", str(tmp_path), "--dask", "garbage"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr == ("trace-report: error: --dask garbage: not a scheduler address "
                           "(missing port number in address 'garbage'; e.g. "
                           "tcp://host:8786)\n"), proc.stderr


@pytest.mark.parametrize("name, args, message", [
    ("trace-report", ["--jobs", "2", "--dask", "tcp://127.0.0.1:9"],
     "argument --dask: not allowed with argument --jobs"),
    ("trace-diff", ["--top", "-1"], "argument --top: must be a whole number >= 0, got '-1'"),
])
def test_contradictory_or_negative_options_are_one_line_and_exit_2(run, name, args, message):
    command = os.path.join(os.path.dirname(sys.executable), name)
    runs = [run] * (2 if name == "trace-diff" else 1)
    proc = subprocess.run([command, *runs, *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr == f"{name}: error: {message} " \
        f"(see {name} --help)\n", proc.stderr


def test_bad_jobs_is_one_line_and_exit_2(run, tmp_path):
    command = os.path.join(os.path.dirname(sys.executable), "trace-report")
    proc = subprocess.run([command, run, "--jobs", "0"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and proc.stderr == (
        "trace-report: error: argument --jobs: must be a whole number >= 1, got '0' "
        "(see trace-report --help)\n")
