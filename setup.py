"""paratrace: see what a parallel PyTorch training run really does."""
from setuptools import find_packages, setup

setup(
    name="paratrace",
    version="0.1.0",
    description="Record every aten op and collective of a parallel PyTorch run; call graphs, "
    "timelines and diffs",
    python_requires=">=3.9",
    packages=find_packages(include=["tracer*", "instrument*", "viz*", "sample_runs*"]),
    package_data={"viz": ["templates/*"], "sample_runs": ["data/*"]},
    install_requires=[
        "torch>=2.4",
        "pyarrow>=14",
        "networkx>=3",
        "graphviz>=0.20",
        "jinja2>=3",
        "numpy",
        "rich>=12",
    ],
    extras_require={"dask": ["dask[distributed]>=2023.1"],
                    "test": ["pytest>=7", "pytest-timeout>=2", "dask[distributed]>=2023.1",
                             "duckdb>=1.0", "polars>=1.0"]},
    entry_points={
        "console_scripts": [
            "trace-run=instrument.launch:main",
            "trace-report=viz.cli:report_main",
            "trace-diff=viz.cli:diff_main",
        ]
    },
)
