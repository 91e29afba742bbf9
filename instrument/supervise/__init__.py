"""trace-run's supervising room: what watches the workers while they run (monitor, watchdog,
orphans), gathers other nodes' traces (gather) and records how the run ended (run_outcome).
It imports nothing of instrument.launch, and no viz: it runs beside the workers.
"""
