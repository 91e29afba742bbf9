"""What the test files share, each thing once: paths of the repository (``paths``); one runner
of paratrace's commands and of Python in a subprocess, with the environment every test process
gets (``cli``); the reference GPT's runs and helpers (``gpt_helpers``, ``traced_runs``); the
headless browser and the report's links (``browser``, ``html_links``); the constructed traces
with known times (``constructed``, ``constructed_timelines``), hand-written exports, op groups
and device windows (``kineto_exports``, ``diff_profiles``, ``device_windows``); the list of
what a trace patches (``patch_targets``); checks of exports and Chrome traces
(``chrome_trace_checks``); the independent computations the tests compare against
(``attribution_oracle``, ``kineto_oracle``, ``counted_ops``, ``whatif_helpers``); waiting on
processes and files without fixed sleeps (``waiting``); and a thread with no Python frame
(``frameless_thread``). Test files never import one another (tests/unit/test_suite_shape.py).
"""
