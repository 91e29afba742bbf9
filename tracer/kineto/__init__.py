"""torch.profiler's Chrome-trace exports (Kineto), read exactly and without running code: the
streamed JSON reader (``stream``, ``events``), the GPU activity it holds (``chrome_trace``), the
host side and its collectives (``host``, ``comm``), the converter into paratrace's own trace
files (``convert``), and a run made of exports alone (``inputs``, ``run``:
``trace-report --kineto``). The recorder uses the same reader for the device windows it saves.
Built on vocab and files; no torch.
"""
