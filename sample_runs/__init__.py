"""Reference GPT for paratrace: a GPT-2-style model trained with Megatron-style tensor,
sequence, pipeline and data parallelism, small enough to trace on a laptop.

Run ``python -m sample_runs.train --help``; see docs/reference-gpt.md.
"""
