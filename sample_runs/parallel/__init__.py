"""Parallelism schemes of the reference GPT, one file per scheme with its communication file
beside it (picotron's layout): tensor_parallel + tp_communications, pipeline_parallel +
pp_communications + pp_schedules, data_parallel; process_groups builds every group from one grid.
"""
