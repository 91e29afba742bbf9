"""Which code is library (tracer.vocab.library): by default torch, the standard library and
paratrace; every other package is the user's, installed or not. ``--library`` / ``--no-library``
(``tracer.trace(library=...)``) change it; the trace keeps the rule and the report classifies
recorded frames by it. In-process: a package of the test's own, outside site-packages, stands
for an installed framework."""
from __future__ import annotations

import os
import sys
import sysconfig
import textwrap

import pytest
import torch

import tracer
from instrument.launch import trace_run
from tracer.vocab.library import LibraryRule, LibrarySpecError, parse_specs
from viz.analysis.callgraphs.op_groups import group_ops, split_stack
from support.paths import REPO

SITE = sysconfig.get_paths()["purelib"]
TORCH = os.path.dirname(torch.__file__)
STDLIB = sysconfig.get_paths()["stdlib"]


def test_by_default_only_torch_the_stdlib_and_paratrace_are_library():
    rule = LibraryRule.build()
    assert rule.is_library(os.path.join(TORCH, "nn", "modules", "linear.py"))
    assert rule.is_library(os.path.join(STDLIB, "contextlib.py"))
    assert rule.is_library("<frozen importlib._bootstrap>")
    assert rule.is_library(str(REPO / "tracer" / "recorder" / "session.py"))
    # installed packages are the user's: the code people come to see
    assert not rule.is_library(os.path.join(SITE, "transformers", "models", "gpt2",
                                            "modeling_gpt2.py"))
    assert not rule.is_library(os.path.join(SITE, "lightning", "pytorch", "trainer.py"))
    assert not rule.is_library(str(REPO / "sample_runs" / "model.py"))
    assert not rule.is_library("/somewhere/else/train.py")


def test_specs_add_and_remove_packages_later_ones_refining():
    transformers = os.path.join(SITE, "transformers", "trainer.py")
    accelerate = os.path.join(SITE, "accelerate", "accelerator.py")
    lightning = os.path.join(SITE, "lightning", "pytorch", "trainer.py")
    linear = os.path.join(TORCH, "nn", "modules", "linear.py")
    rule = LibraryRule.build(["accelerate"])
    assert rule.is_library(accelerate) and not rule.is_library(transformers)
    rule = LibraryRule.build(["-torch"])
    assert not rule.is_library(linear)
    # every installed package but one: a package named beats site-packages
    rule = LibraryRule.build(["site-packages", "-transformers"])
    assert rule.is_library(lightning) and rule.is_library(accelerate)
    assert not rule.is_library(transformers) and rule.is_library(linear)
    rule = LibraryRule.build(["accelerate,-accelerate"])
    assert not rule.is_library(accelerate)
    assert parse_specs(["a,-b", "c"]) == [("a", True), ("b", False), ("c", True)]
    for bad in (["nosuchpackage_xyz"], [""], ["-"], ["a b"]):
        with pytest.raises(LibrarySpecError):
            LibraryRule.build(bad)


def test_the_rule_travels_in_the_trace_and_the_report_uses_it(tmp_path, monkeypatch):
    """A package of our own (outside site-packages) calls torch: its frames are the user's by
    default, folded into the call into it with library=[name]; viz splits the recorded
    frames by the trace's rule, not by where files lie."""
    root = tmp_path / "pkgs"
    (root / "ptfakepkg").mkdir(parents=True)
    (root / "ptfakepkg" / "__init__.py").write_text(textwrap.dedent("""\
        import torch

        def layer(x):
            return torch.relu(x @ x)          # LAYER LINE
        """))
    monkeypatch.syspath_prepend(str(root))
    import ptfakepkg
    stacks = {}
    for name, specs in (("default", ()), ("library", ("ptfakepkg",))):
        out = tmp_path / name
        with tracer.trace(out, clock_sync=False, library=specs):
            ptfakepkg.layer(torch.ones(2, 2))
        trace = tracer.load(out / "rank-0.arrow")
        assert trace.meta["library"]["specs"] == list(specs)
        assert trace.meta["options"]["library"] == list(specs)
        (relu,) = [e for e in trace.records() if e["op"] == "aten.relu.default"]
        stacks[name] = relu["stack"]
        groups = [g for g in group_ops(trace) if g.op == "aten.relu.default"]
        stacks[name + "-path"] = [f.function for f in groups[0].path]
        stacks[name + "-boundary"] = groups[0].boundary
    package = str(root / "ptfakepkg" / "__init__.py")
    # default: the package's line is the user's innermost frame, under the test's
    assert stacks["default"][0][:3] == (package, 4, "layer")
    assert stacks["default-path"][-1] == "layer" and stacks["default-boundary"] is None
    # as library: folded into the boundary call from this test
    assert stacks["library"][0][:3] == (package, 4, "layer")        # kept: the boundary
    assert stacks["library"][1][2] == sys._getframe().f_code.co_name
    assert stacks["library-path"][-1] == sys._getframe().f_code.co_name
    assert stacks["library-boundary"].function == "layer"
    # a trace recorded before the rule: by path (site-packages and the stdlib are library)
    frames = [(os.path.join(SITE, "transformers", "x.py"), 1, "f", "f"),
              ("/work/train.py", 2, "main", "main")]
    path, boundary = split_stack(frames)
    assert [f.function for f in path] == ["main"] and boundary.function == "f"


def test_a_library_spec_naming_nothing_installed_is_one_line_exit_2(tmp_path, capsys):
    script = tmp_path / "train.py"
    script.write_text("pass\n")
    for option in ("--library", "--no-library"):
        code = trace_run.main([option, "nosuchpackage_xyz", "--out", str(tmp_path / "run"),
                            str(script)])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and err == ["trace-run: error: --library / --no-library: no installed "
                                     "package named 'nosuchpackage_xyz'"]
    assert not (tmp_path / "run").exists()
