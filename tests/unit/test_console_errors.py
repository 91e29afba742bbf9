"""The console scripts' last guard (tracer.vocab.console_errors): a bug that escapes a command
is one line on stderr naming the exception, where it was raised and the file keeping the
traceback, exit 70; every console script of setup.py goes through it."""
from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

from support.paths import REPO
from tracer.vocab.console_errors import EXIT_BUG, SHOW_TRACEBACK, run_console


def _broken() -> int:
    {}["missing"]               # a bug: KeyError
    return 0


def test_a_bug_is_one_line_with_its_traceback_kept_in_a_file(capsys, monkeypatch, tmp_path):
    monkeypatch.delenv(SHOW_TRACEBACK, raising=False)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)      # take TMPDIR again
    assert run_console("trace-x", _broken) == EXIT_BUG == 70
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    line = re.fullmatch(r"trace-x: internal error: KeyError: 'missing' \(at (.+):(\d+); "
                        r"traceback in (\S+); a bug in paratrace, please report it, or rerun "
                        rf"with {SHOW_TRACEBACK}=1\)\n", err)
    assert line, err
    assert line.group(1) == __file__
    kept = Path(line.group(3))
    assert kept.parent == tmp_path and "in _broken" in kept.read_text()
    assert 'KeyError: \'missing\'' in kept.read_text().splitlines()[-1]


def test_the_traceback_goes_through_on_request_and_exit_statuses_pass(monkeypatch, capsys):
    monkeypatch.setenv(SHOW_TRACEBACK, "1")
    with pytest.raises(KeyError):
        run_console("trace-x", _broken)
    monkeypatch.delenv(SHOW_TRACEBACK)
    assert run_console("trace-x", lambda: 2) == 2
    with pytest.raises(SystemExit):                     # argparse's exits are not bugs
        run_console("trace-x", lambda: sys.exit(2))

    def interrupted() -> int:
        raise KeyboardInterrupt
    assert run_console("trace-x", interrupted) == 130
    assert capsys.readouterr().err == "trace-x: interrupted\n"


def test_every_console_script_goes_through_the_guard():
    tree = ast.parse((REPO / "setup.py").read_text())
    scripts = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
               and isinstance(n.value, str) and re.match(r"trace-\w+=", n.value)]
    assert len(scripts) == 4
    for script in scripts:
        name, target = script.split("=")
        module, func = target.split(":")
        path = REPO / module.replace(".", "/")
        source = (path / "__init__.py" if path.is_dir() else path.with_suffix(".py")).read_text()
        body = re.search(rf"def {func}\(\) -> int:\n(?:    .*\n)*?    return (.*)\n", source)
        assert body and body.group(1).startswith(f'run_console("{name}", '), script



def _exit_status(main, argv: list) -> int:
    try:
        return main(argv)
    except SystemExit as exit:
        return exit.code


def test_the_four_commands_refuse_a_bad_command_line_in_one_style(capsys, tmp_path):
    """argparse's refusals, in every command: ``PROG: error: MESSAGE (see PROG --help)``, one
    line, exit status 2 (docs/contract.md); a part of trace-whatif's command line
    (``--target``) names the command too."""
    from instrument.launch import trace_run
    from viz import cli, whatif_cli
    run = str(tmp_path)
    unknown = "unrecognized arguments: --no-such-option"
    cases = [("trace-run", trace_run.main, ["--no-such-option"], unknown),
             ("trace-report", cli.report_main, [run, "--no-such-option"], unknown),
             ("trace-diff", cli.diff_main, [run, run, "--no-such-option"], unknown),
             ("trace-whatif", whatif_cli.main, [run, "--out", run, "--no-such-option"], unknown),
             ("trace-whatif", whatif_cli.main, [run, "--out", run, "--target", "--tp 0"],
              "argument --tp: must be a whole number >= 1, got '0'"),
             ("trace-report", cli.report_main, [], "the following arguments are required: "
              "run_dir")]
    for prog, main, argv, message in cases:
        assert _exit_status(main, argv) == 2, (prog, argv)
        assert capsys.readouterr().err == f"{prog}: error: {message} (see {prog} --help)\n"


def test_trace_report_help_says_each_thing_once(capsys):
    """``trace-report --help``: RUN_DIR's help named rank-<R>.arrow files twice, the second time
    after the --kineto clause had ended it."""
    from viz import cli
    assert _exit_status(cli.report_main, ["--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert text.count("rank-<R>.arrow files") == 1, text
    assert "a trace-run output directory (or a directory of rank-<R>.arrow files; with --kineto " \
           "and no traces, where the exports' run goes)" in text, text
