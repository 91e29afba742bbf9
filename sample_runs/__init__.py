"""Reference GPT for paratrace: a GPT-2-style model trained with Megatron-style tensor,
sequence, context, pipeline and data parallelism, ZeRO 1-3 and mixture-of-experts layers with
expert parallelism, small enough to trace on a laptop.

Run ``python -m sample_runs.train --help``; see docs/reference-gpt.md.
"""
