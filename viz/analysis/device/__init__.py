"""Device time: GPU activity attributed to the host events that launched it, and a rank's lanes
on the device clock. Built on the timeline's lanes.
"""
