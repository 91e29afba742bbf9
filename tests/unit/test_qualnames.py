"""Qualified names read from source (tracer.recorder.attribution.qualnames: Python 3.10 has no
co_qualname), against names written by hand and against Python's own __qualname__."""
from __future__ import annotations

import importlib
import inspect
import types

import torch.nn.modules
import torch.nn.parallel.distributed

from tracer.recorder.attribution import qualnames

SOURCE = '''\
import functools


def top(x=[i for i in range(2)]):
    def inner():
        return [j for j in range(3)]
    return inner, lambda: {k: k for k in range(2)}


class Outer:
    square = staticmethod(lambda v: v * v)

    @functools.lru_cache()
    @staticmethod
    def cached(a):
        return a

    class Inner:
        def method(self):
            return (g for g in [[h for h in range(2)] for _ in range(2)])

    async def coroutine(self):
        return None
'''

# (code's first line, name) -> qualified name: as CPython 3.11's compiler names them
EXPECTED = {
    (4, "top"): "top",
    (4, "<listcomp>"): "<listcomp>",                       # a default: evaluated at module level
    (5, "inner"): "top.<locals>.inner",
    (6, "<listcomp>"): "top.<locals>.inner.<locals>.<listcomp>",
    (7, "<lambda>"): "top.<locals>.<lambda>",
    (7, "<dictcomp>"): "top.<locals>.<lambda>.<locals>.<dictcomp>",
    (10, "Outer"): "Outer",
    (11, "<lambda>"): "Outer.<lambda>",
    (13, "cached"): "Outer.cached",                        # from its first decorator's line
    (18, "Inner"): "Outer.Inner",
    (19, "method"): "Outer.Inner.method",
    (20, "<genexpr>"): "Outer.Inner.method.<locals>.<genexpr>",
    (22, "coroutine"): "Outer.coroutine",
}


def codes(code):
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield const
            yield from codes(const)


def test_each_definition_gets_the_name_the_compiler_gives_it(tmp_path):
    path = tmp_path / "sample.py"
    path.write_text(SOURCE)
    named = {}
    for d in qualnames.definitions(str(path)):
        named.setdefault((d.code_first, d.name), d.qualname)
    # two comprehensions of line 20 (the list inside the generator's iterable) share a key:
    # 3.10 cannot tell them apart, and the outer one is named
    assert named == {**EXPECTED, (20, "<listcomp>"): "Outer.Inner.method.<locals>.<listcomp>"}
    # the code objects this Python compiles (3.12 on inlines list, set and dict
    # comprehensions: no code object of their own) get those names
    compiled = list(codes(compile(SOURCE, str(path), "exec")))
    assert {(c.co_firstlineno, c.co_name) for c in compiled} >= \
        {key for key in EXPECTED if not key[1].endswith("comp>")}
    for code in compiled:
        assert qualnames.from_source(code) == named[(code.co_firstlineno, code.co_name)]
        if hasattr(code, "co_qualname") and code.co_firstlineno != 20:   # Python 3.11 on
            assert qualnames.from_source(code) == code.co_qualname


def test_the_sources_names_are_pythons_own_for_torchs_functions():
    """Every function and method torch.nn's modules and DDP define: its __qualname__."""
    checked = 0
    for module in (*(importlib.import_module(f"torch.nn.modules.{name}") for name in
                     ("linear", "conv", "activation", "container", "module", "normalization")),
                   torch.nn.parallel.distributed):
        for owner in (module, *(v for v in vars(module).values() if inspect.isclass(v))):
            for value in list(vars(owner).values()):
                function = inspect.unwrap(getattr(value, "__func__", value))
                code = getattr(function, "__code__", None)
                if code is None or code.co_filename != module.__file__:
                    continue
                assert qualnames.from_source(code) == function.__qualname__, function
                checked += 1
    assert checked > 300


def test_a_file_without_source_keeps_the_bare_name(tmp_path):
    code = compile("def f():\n    pass\n", str(tmp_path / "gone.py"), "exec")
    assert [qualnames.from_source(c) for c in codes(code)] == ["f"]
    broken = tmp_path / "broken.py"
    broken.write_text("def f(:\n")
    fake = compile("def f():\n    pass\n", str(broken), "exec")
    assert [qualnames.from_source(c) for c in codes(fake)] == ["f"]


def test_of_code_is_the_codes_own_where_python_has_one():
    def local():
        pass
    assert qualnames.of_code(local.__code__) == local.__qualname__ == \
        "test_of_code_is_the_codes_own_where_python_has_one.<locals>.local"
    assert qualnames.NATIVE == hasattr(local.__code__, "co_qualname")
