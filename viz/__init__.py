"""paratrace viz: load runs, analyse them (call graphs, timelines, diffs) and render reports."""
