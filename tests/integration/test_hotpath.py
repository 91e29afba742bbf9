"""The recorder's C hot path (tracer/recorder/csrc/hotpath/) against its Python twins: the same
stack ids and texts, the same shape signatures, the same trace rows; and what C must not do (leak a
reference, crash on a bad argument or a failing callback)."""
from __future__ import annotations

import gc
import importlib.util
import os
import random
import subprocess
import sys
import tracemalloc

import pytest
import torch

import tracer
from tracer.recorder.attribution import shapes
from tracer.recorder.attribution.stacks import INTERNAL, PyStackInterner, StackInterner
from support.paths import SCRIPTS

needs_c = pytest.mark.skipif(StackInterner.HOT_PATH != "c",
                             reason="PARATRACE_PURE_PYTHON asks for the Python hot path")


def test_the_c_hot_path_is_built_and_is_what_the_recorder_uses():
    """setup.py builds it wherever a C compiler and CPython >= 3.11 are (scripts/setup.sh
    installs one); a silent fallback to Python would hide a build failure in CI."""
    if os.environ.get("PARATRACE_PURE_PYTHON"):
        pytest.skip("PARATRACE_PURE_PYTHON asks for the Python hot path")
    if sys.version_info < (3, 11) or sys.implementation.name != "cpython":
        pytest.skip("setup.py builds the C hot path for CPython >= 3.11 only")
    try:
        from tracer.recorder import _hotpath
    except ImportError as exc:    # pragma: no cover - the failure this test is for
        pytest.fail(f"tracer.recorder._hotpath is not built ({exc}): pip install -e . "
                    "with a C compiler")
    assert issubclass(StackInterner, _hotpath.StackWalk) and StackInterner.HOT_PATH == "c"
    assert issubclass(shapes.ShapeSignatures, _hotpath.ShapeKeys)
    assert not issubclass(PyStackInterner, _hotpath.StackWalk)
    assert not issubclass(shapes.PyShapeSignatures, _hotpath.ShapeKeys)


# ------------------------------------------------------------------------------ stack capture
def _internal(interner, code):
    """``code`` stands for paratrace's own frames and torch's dispatch frames."""
    interner.kind_of_code[id(code)] = (INTERNAL, False, code)
    return interner


class _Twins:
    """The C and the Python interner, fed the same frames; every capture must agree."""

    def __init__(self, **options):
        self.pair = [cls(**options) for cls in (StackInterner, PyStackInterner)]
        self.captures = 0

    def check(self, frame):
        ids = [interner.capture(frame) for interner in self.pair]
        assert ids[0] == ids[1]
        assert self.pair[0].values[ids[0]] == self.pair[1].values[ids[1]]
        self.captures += 1


def _random_calls(twins, rng, n):
    """Calls, returns, generators resumed by other callers, and captures from internal frames
    and from several instructions of one function."""

    def internal_ops():      # the stand-in of internal frames (see _internal)
        twins.check(sys._getframe(0))
        twins.check(sys._getframe(0))

    def resumed(k):
        def generator():
            while True:
                descend(k)
                yield
        g = generator()
        next(g)
        next(g)                             # the same generator frame, another caller

    def descend(k):
        for _ in range(rng.randint(1, 3)):
            if k > 0 and rng.random() < 0.6:
                descend(k - 1)
            elif k > 0 and rng.random() < 0.2:
                resumed(k - 1)
            elif rng.random() < 0.2:
                internal_ops()
            elif rng.random() < 0.5:
                twins.check(sys._getframe(0))
            else:
                twins.check(sys._getframe(0))   # the same frame, another instruction

    descend(n)
    return internal_ops.__code__


@pytest.mark.parametrize("options", [{"depth": 3}, {"depth": 32},
                                     {"depth": 6, "library_frames": True}])
def test_c_and_python_stack_capture_agree_on_random_call_patterns(options):
    rng = random.Random(1)
    twins = _Twins(**options)
    internal_code = _random_calls(_NoCheck(), rng, 0)    # nested functions share their code
    for interner in twins.pair:
        _internal(interner, internal_code)
    for _ in range(40):
        _random_calls(twins, rng, rng.randint(0, 9))
    assert twins.captures > 200
    c, py = twins.pair
    assert c.values == py.values and c._node_sid == py._node_sid


class _NoCheck:
    def check(self, frame):
        pass


def test_c_capture_outside_any_user_frame_is_the_root_stack():
    """A walk that finds only internal frames (or none) gives the empty stack, as Python's."""
    def only_internal():
        return sys._getframe(0)
    frame = only_internal()
    c = StackInterner()
    py = PyStackInterner()
    for interner in (c, py):
        for f in _frames_outward(frame):        # every frame of this stack is internal here
            interner.kind_of_code[id(f.f_code)] = (INTERNAL, False, f.f_code)
    assert c.values[c.capture(frame)] == py.values[py.capture(frame)] == "[]"


def _frames_outward(frame):
    while frame is not None:
        yield frame
        frame = frame.f_back


@pytest.mark.parametrize("base", [StackInterner, PyStackInterner])
def test_a_capture_that_another_capture_interrupts_keeps_every_stack_right(base):
    """Making a node runs Python, where another recording thread may capture and change the
    path under the walk. Simulated deterministically: each new node first captures from an
    unrelated frame. No capture may fail, and every stack must be a fresh walk's."""
    elsewhere = []

    class Interrupted(base):
        def _new_node(self, parent, frame, lasti, lastis):
            if elsewhere and not self._inside:
                self._inside = True
                try:
                    self.capture(elsewhere[-1])
                finally:
                    self._inside = False
            return super()._new_node(parent, frame, lasti, lastis)

    interner = Interrupted()
    interner._inside = False

    def other_thread(depth):           # an unrelated stack, kept alive while captures run
        if depth:
            return other_thread(depth - 1)
        elsewhere.append(sys._getframe(0))

    other_thread(3)

    def check(frame):
        fresh = PyStackInterner()
        assert interner.values[interner.capture(frame)] == fresh.values[fresh.capture(frame)]

    def descend(k):
        check(sys._getframe(0))
        if k:
            descend(k - 1)
            check(sys._getframe(0))      # the same frame after a call returned
        check(sys._getframe(0))

    for depth in (5, 2, 7):
        descend(depth)
        other_thread(depth)


@needs_c
def test_c_capture_rejects_what_is_not_a_frame_and_an_interner_that_is_not_set_up():
    from tracer.recorder import _hotpath
    with pytest.raises(TypeError, match="takes a frame"):
        StackInterner().capture("not a frame")
    with pytest.raises(TypeError, match="not set up"):
        _hotpath.StackWalk().capture(sys._getframe(0))
    with pytest.raises(TypeError, match="not set up"):
        _hotpath.ShapeKeys().id_of(())


@pytest.mark.parametrize("base", [StackInterner, PyStackInterner])
def test_an_error_in_a_callback_propagates_out_of_the_walk(base):
    class Failing(base):
        def classify(self, code):
            raise ValueError("classify failed")

    with pytest.raises(ValueError, match="classify failed"):
        Failing().capture(sys._getframe(0))

    if base is StackInterner and base.HOT_PATH == "c":
        class BadKind(base):
            def classify(self, code):
                return "not a tuple"

        with pytest.raises(TypeError, match="kind"):
            BadKind().capture(sys._getframe(0))


def _traced_growth(run, counts=(500, 2000)) -> int:
    """How much more traced memory ``run(count)`` leaves behind for the larger count than for
    the smaller one (each after the same warm-up): a leak of one object a call shows as tens of
    kilobytes; whatever a call site allocates once (new stack nodes) cancels out, and the
    allocators' own noise is about a kilobyte."""
    grown = []
    for count in counts:
        run(counts[0])                        # from the same call site as the measured run
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            run(count)
            gc.collect()     # torch's tensor-subclass getters leave cycles for the collector
            grown.append(tracemalloc.get_traced_memory()[0] - before)
        finally:
            tracemalloc.stop()
    return grown[1] - grown[0]


@pytest.mark.parametrize("cls", [StackInterner, PyStackInterner])
def test_capture_holds_no_reference_it_does_not_release(cls):
    interner = cls()
    # instruction offsets past 256, so that each is an int of its own (not a cached small one)
    namespace = {"interner": interner, "sys": sys}
    exec("def leaf():\n" + "    x = 1\n" * 100 + "    interner.capture(sys._getframe(0))\n"
         "    interner.capture(sys._getframe(0))\n", namespace)
    leaf = namespace["leaf"]

    def middle():
        leaf()
        interner.capture(sys._getframe(0))

    def pattern(count):
        for _ in range(count):
            middle()

    pattern(10)
    refs = sys.getrefcount(leaf.__code__)
    assert _traced_growth(pattern, (500, 4000)) < 16384       # 10,500 more captures
    after = sys.getrefcount(leaf.__code__)       # (pytest's assert would hold one more)
    assert after == refs
    interner.release()


# ---------------------------------------------------------------------------- shape signatures
class _Sub(torch.Tensor):
    """A tensor subclass: its kind comes from the type table, not the plain-tensor shortcut."""


def _argument_lists():
    x = torch.ones(2, 3)
    big = torch.ones(300, 1)                 # sizes past the small-int cache
    p = torch.nn.Parameter(torch.ones(3))
    sub = torch.ones(4).as_subclass(_Sub)
    return [
        (), (x,), (x, x), (p,), (x, p, 1, None, 2.0, "s"), (big,), (torch.tensor(3),),
        (torch.ones(2, dtype=torch.bfloat16), torch.zeros(1, dtype=torch.int64)),
        ([x, x],), ((x, p),), ([],), ([1, 2], x), ([x, 3, p],), ([[x]],), (sub,), ([sub, x],),
        (x, torch.Size([2, 3])), (torch.empty(0, 5),), ([x], [p]),
    ]


def test_c_and_python_shape_signatures_agree():
    texts = []

    def intern(text):
        if text not in texts:
            texts.append(text)
        return texts.index(text)

    c, py = shapes.ShapeSignatures(intern), shapes.PyShapeSignatures(intern)
    for args in _argument_lists() * 2:          # the second time from the caches
        assert texts[c.id_of(args)] == texts[py.id_of(args)], args
    assert "f32[300,1]" in texts and "[f32[2,3],f32[3]]" in texts and "bf16[2] i64[1]" in texts
    assert "f32[4]" in texts and "[f32[4],f32[2,3]]" in texts and "f32[0,5]" in texts


@pytest.mark.parametrize("cls", [shapes.ShapeSignatures, shapes.PyShapeSignatures])
def test_shape_keys_hold_no_reference_they_do_not_release(cls):
    signatures = cls(lambda text: len(text))
    # (not the subclass: its getters run torch's Python, whose allocations come and go)
    lists = [args for args in _argument_lists()
             if not any(isinstance(a, _Sub) or isinstance(a, list) and any(
                 isinstance(t, _Sub) for t in a) for a in args)]

    def pattern(count):
        for _ in range(count):
            for args in lists:
                signatures.id_of(args)

    pattern(1)
    x = lists[1][0]
    refs = sys.getrefcount(x)
    assert _traced_growth(pattern, (20, 200)) < 16384     # 3,060 more signatures
    after = sys.getrefcount(x)
    assert after == refs


def test_an_error_reading_a_tensor_propagates_out_of_the_c_shape_key():
    class Broken(torch.Tensor):
        @property
        def shape(self):
            raise RuntimeError("no shape here")

    broken = torch.ones(2).as_subclass(Broken)
    for signatures in (shapes.ShapeSignatures(len), shapes.PyShapeSignatures(len)):
        with pytest.raises(RuntimeError, match="no shape here"):
            signatures.id_of((broken,))
        with pytest.raises(TypeError):
            signatures.id_of(5)


# --------------------------------------------------------------------------------- the trace
def _rows(path):
    trace = tracer.load(path)
    timeless = [{k: v for k, v in r.items() if k not in ("t0", "t1", "t_ret")}
                for r in trace.records()]
    memory = None if trace.memory is None else \
        [tuple(e) for e in zip(*(getattr(trace.memory, k).tolist() for k in
                                 ("kind", "storage", "bytes", "category", "thread", "step",
                                  "row")))]
    return trace.meta["hot_path"], timeless, memory


@pytest.mark.parametrize("memory", [False, True], ids=["ops", "ops+memory"])
def test_either_hot_path_records_the_same_rows(tmp_path, memory):
    script = str(SCRIPTS / "hot_path_trace.py")
    runs = {}
    for name, pure in (("c", ""), ("python", "1")):
        env = {**os.environ, "PARATRACE_PURE_PYTHON": pure, "OMP_NUM_THREADS": "1"}
        subprocess.run([sys.executable, script, str(tmp_path / name),
                        *(["memory"] if memory else [])], env=env, check=True, timeout=300)
        runs[name] = _rows(tmp_path / name / "rank-0.arrow")
    # the memory rows, time aside: the same storages seen, in the same order, by the same ops,
    # freed and classed the same (two frees at one moment may come in either order: the paths
    # drop their references to an op's arguments and result in different orders)
    assert (runs["c"][2] is not None) == (runs["python"][2] is not None) == memory
    if memory:
        assert [e for e in runs["c"][2] if e[0] == 0] == [e for e in runs["python"][2]
                                                          if e[0] == 0]
        assert sorted(runs["c"][2]) == sorted(runs["python"][2])
        # every category but comm (one process: no collective)
        assert len(runs["c"][2]) > 300 and {e[3] for e in runs["c"][2]} == {0, 2, 3, 4, 5}
    assert runs["python"][0] == "python"
    built = importlib.util.find_spec("tracer.recorder._hotpath") is not None
    assert runs["c"][0] == ("c" if built else "python")
    c_rows, py_rows = runs["c"][1], runs["python"][1]
    assert len(c_rows) == len(py_rows) > 300
    assert c_rows == py_rows
    # every branch of on_op (and of its C twin, tracer/recorder/csrc/hotpath/onop.c) was taken
    assert {r["phase"] for r in c_rows} == {"forward", "backward", "recompute", "grad_sync",
                                           "optimizer", "other"}
    cat = next(r for r in c_rows if r["op"] == "aten.cat.default")
    assert cat["shapes"] == "[f32[4,8],f32[4,8]]"
    assert [f[3] for f in cat["stack"]] == ["Block.forward", "Model.forward", "main", "<module>"]
    assert any(r["phase"] == "backward" and r["fwd_stack"] for r in c_rows)
