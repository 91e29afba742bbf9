"""Where ops come from: one rank's events grouped by attribution path (the aggregate every
analysis reads), their FLOPs, the run's source files, and the call graphs and module trees
built from the groups. The lowest room of the analyses: it imports none of the others.
"""
