"""The recorder: a TorchDispatchMode that writes every aten op and collective of this process,
with its source line, module and phase, to the trace files (tracer.files). ``session`` runs a
recording and owns its parts (``comm``, ``flusher``, ``phases``); the rooms below it say the
rest: ``hotpath/`` (the dispatch mode and the C hot path, ``csrc/hotpath/``, built as ``_hotpath``),
``process/`` (rank, clock, process group, exits), ``attribution/`` (where an op came from:
stacks, modules, annotations, shapes), ``memory/`` (the storages ops make), ``device/`` (GPU
time: CUPTI driven directly, ``_cupti``, or Kineto's windows) and ``frameworks/`` (DTensor,
compile, HOPs, pipelining, FSDP2); ``patches/`` is every place torch is patched, and ``compat``
every bridge across torch versions (docs/architecture.md). The only part of paratrace that
imports torch, and only when a recording starts: importing this package imports nothing.
"""
