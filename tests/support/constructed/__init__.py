"""Constructed traces with known times, written through the recorder's own writer: test and
benchmark support, not part of the installed package. ``synthetic``: ranks built event by
event (tests); ``workloads``: whole pipeline-parallel runs of any size (benchmarks, scale
tests). Tests import them as ``constructed.*`` (pytest puts tests/ on ``sys.path``); a
benchmark puts tests/ on ``sys.path`` first."""
