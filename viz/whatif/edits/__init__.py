"""What a target on any model changes of the recorded step: activation checkpointing, the
data-parallel collectives, a TP plan, and the program edited from the recorded one.
"""
