"""What the flusher's write of a step costs, by how the batch is compressed, side by side.

Records the tiny model of benchmarks/overhead.py, cuts its rows into batches of one step's ops
(what the flusher writes at a step boundary), and writes them again and again to memory with
each option, interleaved, reporting medians over rounds: the process's CPU time a batch (every
thread: Arrow's pool included), wall time a batch, and bytes an event.

- zstd on the writing thread (``use_threads=False``): what tracer.files.format writes;
- zstd on Arrow's thread pool (pyarrow's default, ``use_threads=True``);
- lz4 on the writing thread: cheaper, bigger files;
- uncompressed.

    python benchmarks/trace_write.py [--rounds 15] [--reps 20]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import pyarrow as pa
import pyarrow.ipc as ipc

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import overhead_recorders  # noqa: E402  (it puts the repository on sys.path)
import tracer  # noqa: E402
from tracer.files.format import write_options  # noqa: E402

OPTIONS = {
    "zstd, writing thread (paratrace)": write_options(dictionary_deltas=True),
    "zstd, Arrow's thread pool": ipc.IpcWriteOptions(compression="zstd", use_threads=True,
                                                    emit_dictionary_deltas=True),
    "lz4, writing thread": ipc.IpcWriteOptions(compression="lz4", use_threads=False,
                                              emit_dictionary_deltas=True),
    "uncompressed": ipc.IpcWriteOptions(compression=None, use_threads=False,
                                       emit_dictionary_deltas=True),
}


def step_batches(tmp: str) -> tuple:
    """(schema, batches of one step's ops each, ops a step) from a recording of the tiny
    model."""
    recorders = overhead_recorders.Recorders(tmp, debug_mode=False, flush_interval=100.0)
    recorders.model = "tiny"
    overhead_recorders.step_times("tiny", 4, recorders.paratrace)
    path = recorders.last_trace["tiny"]
    ops_per_step = overhead_recorders.ops_per_step(tracer.load(path))
    with pa.OSFile(path) as source:
        reader = ipc.open_stream(source)
        table = reader.read_all().unify_dictionaries().combine_chunks()
    last_steps = table.slice(max(0, table.num_rows - 3 * ops_per_step))
    return reader.schema, last_steps.to_batches(max_chunksize=ops_per_step), ops_per_step


def write_all(schema, batches: list, options) -> tuple:
    """(process CPU seconds, wall seconds, bytes) of writing `batches` once."""
    sink = pa.BufferOutputStream()
    writer = ipc.new_stream(sink, schema, options=options)
    wall, cpu = time.perf_counter(), time.process_time()
    for batch in batches:
        writer.write_batch(batch)
    writer.close()
    return time.process_time() - cpu, time.perf_counter() - wall, sink.getvalue().size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--reps", type=int, default=20, help="writes of the batches a round")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        schema, batches, ops_per_step = step_batches(tmp)
    events = sum(b.num_rows for b in batches)
    cpu = {name: [] for name in OPTIONS}
    wall = {name: [] for name in OPTIONS}
    size = {}
    for round_ in range(args.rounds + 1):       # round 0 warms up, not counted
        for name, options in OPTIONS.items():
            runs = [write_all(schema, batches, options) for _ in range(args.reps)]
            if round_:
                cpu[name].append(statistics.median(r[0] for r in runs) / len(batches))
                wall[name].append(statistics.median(r[1] for r in runs) / len(batches))
            size[name] = runs[0][2]
    base = statistics.median(cpu["zstd, writing thread (paratrace)"])
    print(f"{len(batches)} batches of {ops_per_step} rows (one step's ops, tiny model); "
          f"medians of {args.rounds} rounds")
    print(f"{'write option':34s} {'CPU/batch':>10s} {'x paratrace':>11s} {'wall/batch':>11s} "
          f"{'bytes/event':>11s}")
    for name in OPTIONS:
        c = statistics.median(cpu[name])
        print(f"{name:34s} {c * 1e3:8.3f}ms {c / base:11.2f} "
              f"{statistics.median(wall[name]) * 1e3:9.3f}ms {size[name] / events:11.2f}")


if __name__ == "__main__":
    main()
