"""The recorder: a TorchDispatchMode that writes every aten op and collective of this process,
with its source line, module and phase, to the trace files (tracer.files). ``session`` runs a
recording; ``_mode`` and the C hot path (``csrc/``, built as ``_hotpath``; ``_native`` finds
it) take each op; ``stacks``, ``modules``, ``phases``, ``comm``, ``dtensor``, ``compiled``,
``hops``, ``fsdp`` and ``pipelining`` say what an op was part of; ``memory`` the storages
ops make and what they are kept for (``tracer.trace(memory=True)``); ``device`` and
``device_worker`` record GPU time in windows; ``flusher`` writes; ``patches/`` is every place
torch is patched, and ``compat`` every bridge across torch versions. The only part of paratrace
that imports torch, and only when a recording starts: importing this package imports nothing.
"""
