"""A rank's GPU-time recording problems as the report words them (viz.analysis.rank): the
trace's ``device_time.error`` (the first) and ``errors`` (how many), from files that may be old
(no ``errors``) or damaged (not a dict, a count that is not a number)."""
from __future__ import annotations

import pytest

from viz.analysis.rank import device_time_warnings


@pytest.mark.parametrize("device_time, words", [
    (None, []),
    ({"source": "cupti", "windows": 3, "error": None, "errors": 0}, []),
    ({"error": "a device window was not saved (disk full)", "errors": 1},
     ["device time: a device window was not saved (disk full)"]),
    ({"error": "device window 2 was lost with the worker", "errors": 2},
     ["device time: device window 2 was lost with the worker (and 1 more error)"]),
    ({"error": "torch.profiler is already running in this process", "errors": 4},
     ["device time: torch.profiler is already running in this process (and 3 more errors)"]),
    ({"error": "an older trace: no count"}, ["device time: an older trace: no count"]),
    ({"error": "a damaged count", "errors": "many"}, ["device time: a damaged count"]),
    ("not an object", []),
])
def test_the_first_error_and_how_many_more(device_time, words):
    meta = {} if device_time is None else {"device_time": device_time}
    assert device_time_warnings(meta) == words
