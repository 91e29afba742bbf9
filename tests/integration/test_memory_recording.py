"""Memory recording (``tracer.trace(memory=True)``) on the CPU, one process, tiny models: the
recorded categories against counts written here, the whole run's peak against a separate
counting mode run in the same recording, activation checkpointing's saving against the ratio
derived from what each layer saves, and traces without memory (recorded without it, or in an
older format) reading as "no memory recorded". No wall-clock assertions."""
from __future__ import annotations

import weakref

import pyarrow as pa
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import checkpoint

import tracer
from tracer.files.format import MEMORY_CATEGORIES, MEMORY_KINDS
from viz.analysis.memory.live_bytes import memory_profile

B, D, STEPS = 16, 64, 3


class StorageCount(TorchDispatchMode):
    """A separate count: after every op, the bytes of the distinct storages alive among every
    op output seen so far, the model's parameters and gradients and the optimizer's state
    (plain weakrefs, summed afresh each time: nothing shared with the recorder)."""

    def __init__(self, model, optimizer):
        super().__init__()
        self.model, self.optimizer = model, optimizer
        self.seen: dict = {}
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                st = t.untyped_storage()
                known = self.seen.get(st._cdata)
                if known is None or known() is not st:   # new, or a freed one's address
                    self.seen[st._cdata] = weakref.ref(st)
        self.peak = max(self.peak, self.live())
        return out

    def live(self) -> int:
        storages = {k: r() for k, r in self.seen.items()}
        held = [p for p in self.model.parameters()] + \
            [p.grad for p in self.model.parameters() if p.grad is not None] + \
            [v for s in self.optimizer.state.values() for v in s.values()
             if isinstance(v, torch.Tensor)]
        for t in held:
            st = t.untyped_storage()
            storages[st._cdata] = st
        return sum(st.nbytes() for st in storages.values() if st is not None)


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(D, 4 * D), torch.nn.ReLU(),
                               torch.nn.Linear(4 * D, D), torch.nn.ReLU(),
                               torch.nn.Linear(D, 8))


def train(model, optimizer, x, steps=STEPS, forward=None):
    for _ in range(steps):
        optimizer.zero_grad()
        loss = (forward or model)(x).sum()
        loss.backward()
        optimizer.step()


def test_mlp_adamw_categories_and_peak_match_independent_counts(tmp_path):
    model = mlp()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    counter = StorageCount(model, optimizer)
    with tracer.trace(str(tmp_path), memory=True):
        with counter:
            x = torch.randn(B, D)
            train(model, optimizer, x)
    trace = tracer.load(str(tmp_path / "rank-0.arrow"))
    assert trace.memory is not None and len(trace.memory)
    profile = memory_profile(trace)
    params = sum(p.nbytes for p in model.parameters())
    steps = sum(s["step"].nbytes for s in optimizer.state.values())
    assert steps == 4 * len(list(model.parameters()))        # a float32 step per parameter
    assert profile.category_peaks["parameters"] == params
    assert profile.category_peaks["gradients"] == params
    assert profile.category_peaks["optimizer_state"] == 2 * params + steps
    assert profile.category_peaks["comm"] == 0
    assert abs(profile.peak_bytes - counter.peak) <= 0.01 * counter.peak
    assert sum(profile.at_peak["category"].values()) == profile.peak_bytes
    assert sum(profile.at_peak["module"].values()) == profile.peak_bytes
    assert sum(profile.at_peak["phase"].values()) == profile.peak_bytes
    # every allocation by an op is linked to that op's row, of the same step
    mem = trace.memory
    linked = mem.row[(mem.kind == MEMORY_KINDS.index("alloc")) & (mem.thread >= 0)]
    assert len(linked) and (linked >= 0).all()
    allocs = (mem.kind == 0) & (mem.row >= 0)
    assert (trace.col("step")[mem.row[allocs]] == mem.step[allocs]).all()
    # what one step frees, the next allocates again: each step ends where the first ended
    assert len(set(profile.step_peaks.values())) == 1


class Blocks(torch.nn.Module):
    """K blocks of Linear-ReLU-Linear-ReLU, then a Linear-ReLU head; ``checkpointed``: each
    block under torch.utils.checkpoint (non-reentrant)."""

    def __init__(self, k: int, checkpointed: bool):
        super().__init__()
        torch.manual_seed(0)
        self.blocks = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(D, D), torch.nn.ReLU(),
                                torch.nn.Linear(D, D), torch.nn.ReLU()) for _ in range(k))
        self.head = torch.nn.Sequential(torch.nn.Linear(D, D), torch.nn.ReLU())
        self.checkpointed = checkpointed

    def forward(self, x):
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if self.checkpointed else block(x)
        return self.head(x)


def activation_peak(tmp_path, checkpointed: bool, k: int) -> int:
    model = Blocks(k, checkpointed)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    out = tmp_path / ("ckpt" if checkpointed else "plain")
    with tracer.trace(str(out), memory=True):
        x = torch.randn(B, D)
        train(model, optimizer, x)
    return memory_profile(tracer.load(str(out / "rank-0.arrow"))).category_peaks["activations"]


def test_checkpointing_keeps_fewer_activations_by_the_derived_ratio(tmp_path):
    # Saved for backward, one B x D float32 tensor each: a Linear saves its input (its weight
    # is a parameter), a ReLU its output, the sum nothing. Without checkpointing: the input,
    # then each block's two ReLU outputs (the second Linear's input is the first ReLU's
    # output), then the head's ReLU output (its Linear's input is the last block's output):
    # 2K + 2. With each block checkpointed (non-reentrant) nothing inside a block is saved
    # (the checkpoint's own hooks take it) but each block's input, which the checkpoint saves
    # through autograd to replay the block: K, then the head's Linear input (the last block's
    # output) and ReLU output: K + 2.
    k = 4
    unit = B * D * 4
    plain = activation_peak(tmp_path, False, k)
    ckpt = activation_peak(tmp_path, True, k)
    assert plain == (2 * k + 2) * unit
    assert ckpt == (k + 2) * unit
    assert ckpt / plain == pytest.approx((k + 2) / (2 * k + 2))


def test_memory_is_recorded_by_default(tmp_path):
    model = mlp()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with tracer.trace(str(tmp_path)):
        train(model, optimizer, torch.randn(B, D), steps=1)
    trace = tracer.load(str(tmp_path / "rank-0.arrow"))
    assert trace.meta["options"]["memory"] is True
    assert memory_profile(trace).category_peaks["parameters"] == \
        sum(p.nbytes for p in model.parameters())


def test_without_memory_no_memory_data_and_old_format(tmp_path):
    model = mlp()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    with tracer.trace(str(tmp_path), memory=False):
        train(model, optimizer, torch.randn(B, D), steps=1)
    path = tmp_path / "rank-0.arrow"
    with pa.OSFile(str(path)) as fh:
        schema = pa.ipc.open_stream(fh).schema
    assert "mem_kind" not in schema.names
    assert schema.metadata[b"paratrace.version"] == b"3"     # what older readers read
    trace = tracer.load(str(path))
    assert trace.memory is None and memory_profile(trace) is None
    assert trace.meta["options"]["memory"] is False
    assert any(r["op"] == "aten.addmm.default" for r in trace.records())


def test_memory_trace_reads_as_version_4_with_op_rows_unchanged(tmp_path):
    x = torch.randn(B, D)
    for memory in (False, True):
        model = mlp()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        with tracer.trace(str(tmp_path / str(memory)), memory=memory):
            train(model, optimizer, x, steps=2)
    plain, mem = (tracer.load(str(tmp_path / str(m) / "rank-0.arrow")) for m in (False, True))
    with pa.OSFile(str(tmp_path / "True" / "rank-0.arrow")) as fh:
        assert pa.ipc.open_stream(fh).schema.metadata[b"paratrace.version"] == b"4"
    assert mem.table.schema.names == plain.table.schema.names      # memory rows split off
    # the same ops in the same order, phases and modules (issue 51: saved-tensor hooks made
    # autograd detach each saved output in backward, not in forward, with memory on)
    fields = ("op", "phase", "module", "step", "shapes")
    assert [tuple(r[k] for k in fields) for r in mem.records()] == \
        [tuple(r[k] for k in fields) for r in plain.records()]
    assert set(MEMORY_CATEGORIES[c] for c in mem.memory.category) <= set(MEMORY_CATEGORIES)


def test_a_child_forked_while_recording_memory_records_none(tmp_path):
    """A DataLoader worker is a fork of a recording process: its copy of memory recording
    forgets its table and its module hooks (exits.py detaches the whole session there), and
    the parent's trace is whole."""
    import os
    from torch.nn.modules import module as nn_module
    with tracer.trace(str(tmp_path)) as session:
        kept = torch.randn(B, D) @ torch.randn(D, D)
        memory = session._memory
        hooks = len(nn_module._global_forward_hooks)
        assert len(memory.live) and memory._module_hooks
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:                                   # the child: report, then leave at once
            torch.ones(3).sum()
            detached = not memory.live and not memory._module_hooks and \
                len(nn_module._global_forward_hooks) == hooks - 1
            os.write(write, b"1" if detached else b"0")
            os._exit(0)
        os.close(write)
        answer = os.read(read, 1)
        os.waitpid(pid, 0)
        assert memory.live and memory._module_hooks    # the parent records on
    assert answer == b"1"
    trace = tracer.load(str(tmp_path / "rank-0.arrow"))
    assert trace.status == "ok" and trace.complete and len(trace.memory)
    assert kept.shape == (B, D)
