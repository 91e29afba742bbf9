"""paratrace instrument: trace-run (torch's launcher with a recorder in every worker), in two
rooms: launch/ (the command line, the launch, the per-worker bootstrap) and supervise/ (watching
the workers, gathering their traces, recording how the run ended)."""
