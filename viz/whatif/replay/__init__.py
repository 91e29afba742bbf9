"""The recording replayed: its execution graph (each rank's program, the communications
tying them), the waits a late completion hid, the simulation that runs a graph into a timeline,
the programs a target is composed of, the models fitted on a recording, and whatif.json's M.
"""
