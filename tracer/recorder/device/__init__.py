"""Device time on CUDA: CUPTI driven directly (``cupti_direct``, the C extension ``_cupti`` built
from ``csrc/cupti/``) or through Kineto's windows (``kineto_windows``, parsed by
``window_worker``), and what both share (``device_notes``)."""
