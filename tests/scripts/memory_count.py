"""What a rank holds, counted by walking the objects (its parameters, their ``.grad`` and the
optimizer's state), nothing taken from paratrace: the independent side of
tests/integration/test_memory_frameworks.py. Shared by memory_ddp.py and memory_fsdp2.py, with
their tiny MLP and batches."""
import json

import torch
import torch.nn as nn

D, STEPS, BATCH = 32, 3, 8


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(D, 4 * D), nn.ReLU(), nn.Linear(4 * D, D), nn.ReLU(),
                         nn.Linear(D, 8))


def batch(rank: int, step: int) -> torch.Tensor:
    return torch.randn(BATCH, D, generator=torch.Generator().manual_seed(100 * rank + step))


def local(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor's local shard (what this rank allocates), else the tensor itself."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor


def storage_bytes(tensors) -> int:
    """Bytes of the distinct storages behind ``tensors`` (a storage shared by two counts once;
    a storage resized to 0, as FSDP2 leaves its unsharded parameters, counts 0)."""
    seen = {}
    for t in tensors:
        st = local(t).untyped_storage()
        seen[st.data_ptr() or id(st)] = st.nbytes()
    return sum(seen.values())


def held(params: list, optimizer: torch.optim.Optimizer) -> dict:
    """What the rank holds now, in bytes: its parameters (FSDP2: their local shards), their
    gradients, AdamW's moments (exp_avg, exp_avg_sq) and its step tensors; with the batch and
    the widths the MLP's activations are derived from."""
    state = list(optimizer.state.values())
    return {"batch": BATCH, "widths": [D, 4 * D, D, 8], "float": 4,
            "parameters": storage_bytes(params),
            "gradients": storage_bytes(p.grad for p in params if p.grad is not None),
            "optimizer_moments": storage_bytes(s[k] for s in state
                                               for k in ("exp_avg", "exp_avg_sq")),
            "optimizer_steps": storage_bytes(s["step"] for s in state),
            "elements": sum(local(p).numel() for p in params)}


def full_bytes(module: nn.Module) -> int:
    """Bytes of ``module``'s own parameters unsharded (a DTensor's ``numel`` is the global one):
    what FSDP2 gathers to run it."""
    return sum(p.numel() * p.element_size() for p in module.parameters(recurse=False))


def train_and_count(model: nn.Module, optimizer: torch.optim.Optimizer, rank: int,
                    more=None) -> dict:
    """STEPS steps; after step 1's ``optimizer.step()`` (the second iteration: trace-run's
    steps advance at each optimizer step) :func:`held` now, with ``more(model)``'s entries."""
    count: dict = {}
    for step in range(STEPS):
        optimizer.zero_grad(set_to_none=True)
        model(batch(rank, step)).square().mean().backward()
        optimizer.step()
        if step == 1:
            count = held(list(model.parameters()), optimizer)
            count.update(more(model) if more is not None else {})
    return count


def write(path: str, count: dict) -> None:
    with open(path, "w") as fh:
        json.dump(count, fh, indent=1)
