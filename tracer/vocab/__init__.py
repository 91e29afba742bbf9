"""The words a trace is written in, shared by the recorder and every reader: which dispatched
ops are collectives and how to read their arguments (``ops``), how a process group is written
down (``groups``), the phases, passes and schedule labels (``labels``), the pipeline schedules'
orders of passes (``schedules``), which source files are library code rather than the user's
(``library``), and how a rank's run ended, the facts of trace-run's run.json (``outcomes``).
Plain tables and functions: nothing here imports torch, pyarrow or another part of paratrace.
"""
