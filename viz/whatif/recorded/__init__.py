"""What a recording of any model says of its run: its parameter layout, its parallel setup, when
each module ran in a step, and the predicted step's segments laid on the recorded one.
"""
