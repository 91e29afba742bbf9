"""The JSON parsers paratrace could read torch.profiler exports with, measured on one export.

    python benchmarks/kineto_parsers.py EXPORT.json [--rounds 3]

Each candidate reads the whole file and touches every event's ``ts`` (what any reader must do
at least), in a fresh process so its peak memory is its own; timed in CPU seconds of that
process (one core; a loaded machine changes it less than wall time): the standard library's
``json.load``, its C scanner over a sliding buffer one event at a time (``raw_decode``, what
paratrace uses, in :mod:`tracer.kineto.stream`), and paratrace's whole reader
(:func:`tracer.kineto.events.collect`, which also sorts every event into columns); where
installed (``pip install 'paratrace[bench]'``): orjson, msgspec, ijson with its yajl2_c
backend, pysimdjson. Prints the median wall time, MB/s, the peak resident memory against the
file's size (the interpreter and, for paratrace's modules, numpy and pyarrow are some 60 MB of
it), whether it streams (memory independent of the file) and whether times stay exact (float64
cannot hold an epoch time in nanoseconds: orjson, msgspec and simdjson give float64;
pysimdjson also decodes lazily, only the ``ts`` asked for).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name -> (module to import, code reading PATH into events E and touching each ts, streams,
# exact)
CANDIDATES = {
    "json.load, exact decimals (stdlib)": (
        "json", "import decimal; d = json.load(open(PATH, 'rb'), parse_float=decimal.Decimal); "
        "n = sum(1 for e in d['traceEvents'] if e.get('ts') is not None)", False, True),
    "raw_decode, sliding buffer (stdlib)": (
        "tracer.kineto.stream", "from tracer.kineto.stream import ExportStream; n = sum(1 for "
        "e in ExportStream(PATH).events() if type(e) is dict and e.get('ts') is not None)",
        True, True),
    "paratrace's reader (raw_decode + columns)": (
        "tracer.kineto.events", "from tracer.kineto.stream import ExportStream; from tracer."
        "kineto.events import collect; n = collect(ExportStream(PATH)).items", True, True),
    "orjson": ("orjson", "d = orjson.loads(open(PATH, 'rb').read()); n = sum(1 for e in "
               "d['traceEvents'] if e.get('ts') is not None)", False, False),
    "msgspec": ("msgspec", "d = msgspec.json.decode(open(PATH, 'rb').read()); n = sum(1 for e "
                "in d['traceEvents'] if e.get('ts') is not None)", False, False),
    "ijson (yajl2_c), exact decimals": (
        "ijson", "import ijson.backends.yajl2_c as ij; n = sum(1 for e in ij.items(open(PATH, "
        "'rb'), 'traceEvents.item', use_float=False) if e.get('ts') is not None)", True, True),
    "pysimdjson": ("simdjson", "d = simdjson.Parser().parse(open(PATH, 'rb').read()); n = "
                   "sum(1 for e in d['traceEvents'] if e.get('ts') is not None)", False, False),
}
_RUN = ("import resource, sys, time\nsys.path.insert(0, {repo!r})\nimport {module}\n"
        "PATH = {path!r}\nt = time.process_time()\n{code}\n"
        "print(n, time.process_time() - t, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)")


def available(module: str) -> bool:
    try:
        __import__(module)
        return True
    except ImportError:
        return False


def measure(name: str, path: str, rounds: int) -> tuple:
    """(events, median seconds, peak KiB) of one candidate on ``path``."""
    module, code, _, _ = CANDIDATES[name]
    runs = []
    for _ in range(rounds):
        script = _RUN.format(repo=REPO, module=module.split(".")[0] if "." not in module
                             else module, path=path, code=code)
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                              check=True)
        n, seconds, peak = proc.stdout.split()
        runs.append((int(n), float(seconds), int(peak)))
    return runs[0][0], statistics.median(r[1] for r in runs), max(r[2] for r in runs)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("export", help="an uncompressed torch.profiler export (.json)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    size = os.path.getsize(args.export)
    print(f"{args.export}: {size / 1e6:.1f} MB of JSON; median of {args.rounds} rounds, "
          "each in a fresh process, CPU seconds")
    print(f"{'parser':44s} {'events':>9s} {'cpu s':>7s} {'MB/s':>7s} {'peak MB':>8s} "
          f"{'x file':>6s}  streams  exact ns")
    for name, (module, _, streams, exact) in CANDIDATES.items():
        if not available(module.split(".")[0]):
            print(f"{name:44s} not installed (pip install 'paratrace[bench]')")
            continue
        n, seconds, peak = measure(name, args.export, args.rounds)
        print(f"{name:44s} {n:9,d} {seconds:7.2f} {size / 1e6 / seconds:7.1f} "
              f"{peak / 1024:8.0f} {peak * 1024 / size:6.2f}  {'yes' if streams else 'no':7s}  "
              f"{'yes' if exact else 'no (float64)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
