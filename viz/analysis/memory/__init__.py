"""Memory: live bytes over time by category and what was live at each rank's peak, from the
trace's memory rows. Imports the call-graph room only (a storage's source line).
"""
