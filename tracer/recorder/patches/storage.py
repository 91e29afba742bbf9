"""``torch.UntypedStorage.resize_``, while memory is recorded: a storage's bytes changed in
place (ZeRO-3 and FSDP free parameters' storages with ``resize_(0)`` and gather into them
again), told to the memory recorder (memory_recorder.py) after the call."""
from __future__ import annotations

import functools

import torch


def install(patches, session) -> None:
    recorder = getattr(session, "_memory", None)
    if recorder is None:
        return

    def make(original):
        @functools.wraps(original)
        def resize_(storage, *args, **kwargs):
            out = original(storage, *args, **kwargs)
            recorder.table.resized(storage)
            return out
        return resize_
    patches.wrap(getattr(torch, "UntypedStorage", None), "resize_", make)
