"""The reference GPT's targets (sample_runs.train's flags), by Megatron's rules: the targets
checked, the rules, a pass's compute from the model's parts, a recorded step's anatomy, what the
predictions know of a recording, each rank's plan, torch's interleaved plans restated, and a
target's memory and communication rows.
"""
