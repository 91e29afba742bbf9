"""The trace files, the contract between whoever writes a run and whoever reads it: the host
trace of a rank (``format``: ``rank-<R>.arrow``, an Arrow IPC stream, and its dictionaries),
the GPU activity beside it (``device_format``: ``rank-<R>.device.arrow``), a rank's status
file (``status``), trace-run's record of a run (``run_record``: run.json), the layout of a run
directory (``rundir``) and the reader that opens a trace for analysis (``reader``). Built on
vocab; imports neither torch nor the recorder's C hot path, so a report can be made where torch
is not installed. docs/trace-format.md describes the bytes.
"""
