"""paratrace: see what a parallel PyTorch training run really does."""
import os
import platform
import sys
import sysconfig

from setuptools import Extension, find_packages, setup

# The recorder's hot path in C (tracer/recorder/csrc/hotpath/: on_op's common path, the stack
# walk, the shape keys, memory recording's storage table), for CPython >= 3.11. Optional: where
# it does not build (no compiler) the install goes on and the recorder runs the same code in
# Python.
HOT_PATH_SOURCES = [f"tracer/recorder/csrc/hotpath/{name}.c"
                    for name in ("module", "ptrmap", "walk_tables", "stackwalk", "shapekeys",
                                  "onop", "sessiontypes", "storagetable", "storagetypes")]
HOT_PATH = [Extension("tracer.recorder._hotpath", HOT_PATH_SOURCES,
                      depends=["tracer/recorder/csrc/hotpath/hotpath.h",
                               "tracer/recorder/csrc/hotpath/storagetable.h"],
                      # only PyInit__hotpath is exported (its helpers' names are plain)
                      extra_compile_args=[] if os.name == "nt" else ["-fvisibility=hidden"],
                      optional=True)]
if sys.version_info < (3, 11) or platform.python_implementation() != "CPython":
    HOT_PATH = []
# CUPTI's activity API without Kineto (tracer/recorder/device/cupti_direct.py): no CUPTI header or
# library is needed to build it (it loads the libcupti torch's CUDA build loaded). Optional,
# Linux and CPython only; without it the recorder takes device time through Kineto.
CUPTI = [Extension("tracer.recorder._cupti", ["tracer/recorder/csrc/cupti/cupti.c",
                                              "tracer/recorder/csrc/cupti/cuptitests.c",
                                              "tracer/recorder/csrc/cupti/cuptirecords.c"],
                   depends=["tracer/recorder/csrc/cupti/cuptirecords.h"],
                   extra_compile_args=["-fvisibility=hidden"], libraries=["dl", "pthread"],
                   optional=True)]
if not sys.platform.startswith("linux") or platform.python_implementation() != "CPython":
    CUPTI = []
# A free-threaded build (3.13t on) gets neither: both keep tables that assume the GIL, and
# importing a module that does not declare otherwise turns the GIL back on for the process.
# The recorder runs their Python twins there, and device time comes from Kineto's windows
# (tracer/recorder/hotpath/_native.py, docs/compat.md).
if sysconfig.get_config_var("Py_GIL_DISABLED"):
    HOT_PATH, CUPTI = [], []
FRAMEWORKS = ["transformers==5.24.0", "accelerate==1.15.0", "lightning==2.6.6"]

setup(
    name="paratrace",
    version="0.1.0",
    description="Record every aten op and collective of a parallel PyTorch run; call graphs, "
    "timelines and diffs",
    # tested at both ends (scripts/compat.sh, docs/compat.md): Python 3.10-3.13, torch 2.10-2.14
    python_requires=">=3.10",
    packages=find_packages(include=["tracer*", "instrument*", "viz*", "sample_runs*"]),
    # the C extensions' type stubs (tracer/recorder/_hotpath.pyi, _cupti.pyi) go with them
    package_data={"viz": ["templates/*"], "sample_runs": ["data/*"],
                  "tracer.recorder": ["*.pyi"]},
    ext_modules=HOT_PATH + CUPTI,
    install_requires=[
        "torch>=2.10",
        "pyarrow>=14",
        "networkx>=3",
        "graphviz>=0.20",
        "jinja2>=3",
        "numpy",
        "rich>=12",
    ],
    # the frameworks the suite traces (tests/integration/test_frameworks.py,
    # docs/traced-frameworks.md),
    # pinned: versions whose requirements torch 2.13.0 already meets (pip pulls no other torch)
    extras_require={"dask": ["dask[distributed]>=2023.1"],
                    "frameworks": FRAMEWORKS,
                    # benchmarks/kineto.py: Holistic Trace Analysis side by side (with the
                    # pandas it runs on: 3.x breaks it on large traces), the process-tree
                    # measurements, and the JSON parsers benchmarks/kineto_parsers.py compares
                    "bench": ["holistictraceanalysis==0.5.0", "pandas>=2.2,<3", "psutil>=5.9",
                              "orjson>=3.8,<4", "msgspec>=0.18,<1", "ijson>=3.2,<4",
                              "pysimdjson>=6,<7"],
                    # mypy: the type check of tests/unit/test_types.py (mypy.ini), pinned to a
                    # minor version (a newer one may find new errors in unchanged code)
                    "test": ["pytest>=7", "pytest-timeout>=2", "dask[distributed]>=2023.1",
                             "duckdb>=1.0", "polars>=1.0", "mypy>=2.4.1,<2.5", *FRAMEWORKS]},
    entry_points={
        "console_scripts": [
            "trace-run=instrument.launch:console",
            "trace-report=viz.cli:report_console",
            "trace-diff=viz.cli:diff_console",
            "trace-whatif=viz.whatif_cli:console",
        ]
    },
)
