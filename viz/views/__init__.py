"""Views: a :class:`viz.analysis.RunAnalysis` turned into the rows and texts people read (the
report's pages, the terminal's problem lines, trace-run's hang line). Pure: no file is read or
written here; the renderers (:mod:`viz.render`) draw what these return."""
