"""paratrace instrument: trace-run (torch's launcher with a recorder in every worker)."""
