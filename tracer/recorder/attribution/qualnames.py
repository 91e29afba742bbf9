"""Qualified names of functions (``Block.forward``, ``train.<locals>.step``) on every Python
the recorder supports.

From Python 3.11 a code object carries its own (``co_qualname``). Python 3.10 has only the bare
name, so every ``forward`` of a file would be one function in the call graph; there the
qualified name is read from the file's source instead, once per file: each definition (function,
lambda, class body, comprehension) keyed by the first line of its code object and its name, as
the compiler names it. A file whose source cannot be read or parsed keeps the bare names.

:func:`definitions` also serves tracer.recorder.attribution.fxframes, which finds a function by the
line range of its body (a traceback line names the function, not its code object).
"""
from __future__ import annotations

import ast
import functools
import linecache
from typing import NamedTuple

# a code object's own qualified name (CPython >= 3.11)
NATIVE = hasattr((lambda: 0).__code__, "co_qualname")

_COMPREHENSIONS = {ast.ListComp: "<listcomp>", ast.SetComp: "<setcomp>",
                   ast.DictComp: "<dictcomp>", ast.GeneratorExp: "<genexpr>"}
FUNCTION, LAMBDA, CLASS, COMPREHENSION = "function", "lambda", "class", "comprehension"


class Definition(NamedTuple):
    code_first: int       # its code object's first line (a decorated one: the first decorator's)
    first: int            # the line it is defined on
    last: int             # its body's last line
    name: str
    qualname: str
    kind: str             # FUNCTION, LAMBDA, CLASS or COMPREHENSION


def of_code(code) -> str:
    """The qualified name of the function ``code`` is the code of."""
    return code.co_qualname if NATIVE else from_source(code)


def from_source(code) -> str:
    """``code``'s qualified name as its file's source says it (Python 3.10's way; the bare
    name where the source cannot tell)."""
    return _by_code_start(code.co_filename).get((code.co_firstlineno, code.co_name),
                                                 code.co_name)


@functools.lru_cache(maxsize=None)
def _by_code_start(path: str) -> dict:
    """(code's first line, name) -> qualname of ``path``'s definitions. Two on one line (a
    lambda in a lambda): the outer one's, as Python 3.10 cannot tell them apart."""
    table: dict = {}
    for d in definitions(path):
        table.setdefault((d.code_first, d.name), d.qualname)
    return table


@functools.lru_cache(maxsize=None)
def definitions(path: str) -> tuple:
    """Every :class:`Definition` in ``path``'s source, read once: functions, lambdas, class
    bodies and, as Python 3.10 compiles them, comprehensions. Empty when the source cannot be
    read or parsed."""
    try:
        tree = ast.parse("".join(linecache.getlines(path)))
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return ()
    out: list = []

    def add(node, name: str, qualname: str, kind: str, decorators=()) -> None:
        first = min([node.lineno] + [d.lineno for d in decorators])
        out.append(Definition(first, node.lineno, node.end_lineno or node.lineno, name,
                              qualname, kind))

    def walk(node, prefix: str) -> None:
        """``node`` and what it holds, named under ``prefix``. What a definition evaluates
        where it stands (decorators, defaults, annotations, bases, a comprehension's first
        iterable) keeps the enclosing prefix."""
        if node is None:
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            qualname = prefix + node.name
            add(node, node.name, qualname, FUNCTION, node.decorator_list)
            for outside in (*node.decorator_list, *_evaluated_with(node.args), node.returns):
                walk(outside, prefix)
            for statement in node.body:
                walk(statement, qualname + ".<locals>.")
        elif isinstance(node, ast.ClassDef):
            add(node, node.name, prefix + node.name, CLASS, node.decorator_list)
            for outside in (*node.decorator_list, *node.bases, *node.keywords):
                walk(outside, prefix)
            for statement in node.body:
                walk(statement, prefix + node.name + ".")
        elif isinstance(node, ast.Lambda):
            add(node, "<lambda>", prefix + "<lambda>", LAMBDA)
            for outside in _evaluated_with(node.args):
                walk(outside, prefix)
            walk(node.body, prefix + "<lambda>.<locals>.")
        elif type(node) in _COMPREHENSIONS:
            name = _COMPREHENSIONS[type(node)]
            add(node, name, prefix + name, COMPREHENSION)
            walk(node.generators[0].iter, prefix)
            inner = prefix + name + "."        # no <locals>: a comprehension is no function
            for index, generator in enumerate(node.generators):
                for part in (generator.target, *generator.ifs,
                             generator.iter if index else None):
                    walk(part, inner)
            for part in (getattr(node, "elt", None), getattr(node, "key", None),
                         getattr(node, "value", None)):
                walk(part, inner)
        else:
            for child in ast.iter_child_nodes(node):
                walk(child, prefix)

    try:
        walk(tree, "")
    except RecursionError:        # a pathologically deep file: the definitions found so far
        pass
    return tuple(out)


def _evaluated_with(arguments: ast.arguments) -> list:
    """What a function's definition evaluates where it stands: defaults and annotations."""
    out = [*arguments.defaults, *(d for d in arguments.kw_defaults if d is not None)]
    for argument in (*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs,
                     arguments.vararg, arguments.kwarg):
        if argument is not None and argument.annotation is not None:
            out.append(argument.annotation)
    return out
