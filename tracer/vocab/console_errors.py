"""How the four commands end on bad input and on bugs.

Bad input is one line, ``PROG: error: ...``, and the command's exit status; a bad command line
(what argparse refuses) is :func:`usage_error`'s line and exit status 2 in every command, through
:class:`CommandParser`. An exception that still escapes a command is a bug in paratrace
(:func:`run_console`, the console scripts' last guard). It too gets one line: the exception,
where it was raised, and the file that keeps the whole traceback; the exit status is 70
(``EX_SOFTWARE``). ``PARATRACE_TRACEBACK=1`` lets the traceback through instead, for a developer
at the terminal.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import traceback
from typing import Callable, NoReturn, Optional, cast

EXIT_USAGE = 2                 # argparse's own, for a bad command line
EXIT_BUG = 70                  # sysexits.h EX_SOFTWARE: an internal software error
EXIT_INTERRUPTED = 130         # 128 + SIGINT, as a shell reports it
SHOW_TRACEBACK = "PARATRACE_TRACEBACK"


def usage_error(prog: str, message: str) -> NoReturn:
    """A bad command line: ``PROG: error: MESSAGE (see PROG --help)`` on stderr, exit status
    2."""
    print(f"{prog}: error: {message} (see {prog} --help)", file=sys.stderr)
    sys.exit(EXIT_USAGE)


class CommandParser(argparse.ArgumentParser):
    """argparse whose errors are :func:`usage_error`'s one line. The command named is the first
    word of ``prog``: a parser of a part of the command line (``trace-whatif --target``) names
    its command."""

    def error(self, message: str) -> NoReturn:
        usage_error(self.prog.split()[0], message)


def as_command_parser(parser: argparse.ArgumentParser) -> CommandParser:
    """A parser built elsewhere (torchrun's, which trace-run extends) made a
    :class:`CommandParser`: it adds no state, only its one-line errors."""
    parser.__class__ = CommandParser
    return cast(CommandParser, parser)


def run_console(prog: str, main: Callable[[], int]) -> int:
    """``main()``'s exit status; a bug's one line (module doc) and 70 when it raises."""
    try:
        return main()
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except Exception as exc:                # noqa: BLE001 - the guard of last resort
        if os.environ.get(SHOW_TRACEBACK, "") not in ("", "0"):
            raise
        print(f"{prog}: internal error: {bug_line(exc)}", file=sys.stderr)
        return EXIT_BUG


def bug_line(exc: BaseException) -> str:
    """``Type: message (at file:line; traceback in PATH; a bug in paratrace, please report
    it)``; the traceback file is left out when it cannot be written."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"
    text = str(exc).splitlines()[0] if str(exc) else ""
    kept = _keep_traceback(exc)
    saved = f"; traceback in {kept}" if kept else ""
    return (f"{type(exc).__name__}{': ' + text if text else ''} (at {where}{saved}; a bug in "
            f"paratrace, please report it, or rerun with {SHOW_TRACEBACK}=1)")


def _keep_traceback(exc: BaseException) -> Optional[str]:
    try:
        fd, path = tempfile.mkstemp(prefix="paratrace-", suffix=".traceback.txt")
        with os.fdopen(fd, "w") as out:
            out.write("".join(traceback.format_exception(type(exc), exc, exc.__traceback__)))
        return path
    except OSError:
        return None
