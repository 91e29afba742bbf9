"""Each predicted rank's peak memory on any model, replayed from the recorded step's storages:
the replay, the working storages laid on the predicted step, and a rank's peak.
"""
