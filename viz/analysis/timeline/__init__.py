"""The timeline: each rank's lanes (compute, communication, passes, steps) from its trace, every
rank's put together on rank 0's clock, and what the time metrics, the replayed bubble and the
time per phase measure on them. Imports the call-graph room only (a drawn op's source line).
"""
