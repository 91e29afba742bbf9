"""CUPTI's own headers, where this interpreter's packages hold them (a CUDA build of torch
brings the nvidia-cuda-cupti wheel and triton's copy): the independent source of the record
layouts and callback ids that tracer/recorder/csrc/cupti.c reads."""
from __future__ import annotations

import glob
import os
import re
import sysconfig


def header_sets() -> list:
    """Every directory with CUPTI's headers in this interpreter's packages (the
    nvidia-cuda-cupti wheels, triton's copy), with every other CUDA include dir after it."""
    site = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    dirs = sorted({d for s in site for d in glob.glob(os.path.join(s, "nvidia", "*", "include"))
                   + glob.glob(os.path.join(s, "triton", "backends", "nvidia", "include"))})
    return [(d, [d] + [o for o in dirs if o != d])
            for d in dirs if os.path.exists(os.path.join(d, "cupti_activity.h"))]


def newest(header_dir: str, stem: str) -> str:
    """The newest record version a header set defines (``CUpti_ActivityKernel10``...)."""
    text = ""
    for name in ("cupti_activity.h", "cupti_activity_deprecated.h"):
        path = os.path.join(header_dir, name)
        if os.path.exists(path):
            with open(path) as fh:
                text += fh.read()
    found = [(int(n or 0), f"{stem}{n}") for n in re.findall(rf"\}} {stem}(\d*);", text)]
    return max(found)[1]
