"""Across ranks: collectives matched over their process groups, the critical path of each step,
and the parallel dimension each group carries with what it costs each rank. Built on the
timeline.
"""
