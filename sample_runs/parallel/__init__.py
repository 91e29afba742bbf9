"""Parallelism schemes of the reference GPT, one file per scheme with its communication file
beside it (picotron's layout): tensor_parallel + tp_communications, context_parallel +
cp_communications, pipeline_parallel + pp_communications (the schedules' orders are
tracer.vocab.schedules, which trace-whatif shares), data_parallel, zero + zero3 +
zero_communications, expert_parallel + ep_communications; process_groups builds every group
from one grid.
"""
