"""CUPTI's own headers, where this machine holds them: the interpreter's packages (a CUDA build
of torch brings the nvidia-cuda-cupti wheel and triton's copy), a CUDA toolkit under
/usr/local, and the directories ``PARATRACE_CUPTI_HEADERS`` names (``:``-separated: a wheel
unpacked by hand, docs/gpu.md). The independent source of the record layouts and callback ids
that tracer/recorder/csrc/cupti/cupti.c reads."""
from __future__ import annotations

import glob
import os
import re
import sysconfig

HEADERS_ENV = "PARATRACE_CUPTI_HEADERS"


def header_sets() -> list:
    """Every directory with CUPTI's headers found, with the other CUDA include dirs of its
    source after it (the headers include cuda.h...)."""
    site = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    packaged = sorted({d for s in site
                       for d in glob.glob(os.path.join(s, "nvidia", "*", "include"))
                       + glob.glob(os.path.join(s, "triton", "backends", "nvidia", "include"))})
    toolkits = sorted(glob.glob("/usr/local/cuda*/include"))
    found = [(d, [d] + [o for o in packaged if o != d]) for d in packaged]
    found += [(d, [d]) for d in toolkits]
    # a wheel's headers alone lack cuda.h: any other set's serves (only types are read)
    extra = [d for d in os.environ.get(HEADERS_ENV, "").split(os.pathsep) if d]
    found += [(d, [d] + [o for o in packaged + toolkits if o != d]) for d in extra]
    seen, out = set(), []
    for header_dir, includes in found:
        real = os.path.realpath(header_dir)
        if real not in seen and os.path.exists(os.path.join(header_dir, "cupti_activity.h")):
            seen.add(real)
            out.append((header_dir, includes))
    return out


def api_version(header_dir: str) -> int:
    """The CUPTI API version the headers declare (CUPTI_API_VERSION, as cuptiGetVersion
    returns it)."""
    with open(os.path.join(header_dir, "cupti_version.h")) as fh:
        return int(re.search(r"#define CUPTI_API_VERSION (\d+)", fh.read()).group(1))


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
