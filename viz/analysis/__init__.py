"""The analyses: a run's traces in, :class:`RunAnalysis` out, computed once and handed to every
view and renderer. Pure: nothing here draws or writes a file.

    analysis = analyse(open_run("runs/tp2"), engine)

The map runs per rank (:mod:`.rank`: op groups, counts, GPU attribution, lanes), the reduce
across ranks (:mod:`.timeline.assemble`, :mod:`.timeline.metrics`, :mod:`.crossrank.matching`,
:mod:`.crossrank.critical_path`); :mod:`.map_reduce` drives both on the engine
(docs/architecture.md).
"""
from .map_reduce import analyse, recount
from .run_analysis import RunAnalysis

__all__ = ["RunAnalysis", "analyse", "recount"]
