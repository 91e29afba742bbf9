"""Constructed torch.profiler exports for benchmarks/kineto.py: many ranks of a data-parallel
training job with NCCL, as torch 2.x writes them (indented JSON, ``ts`` in microseconds with
three decimals relative to ``baseTimeNanoseconds``, written last; kernels with every field
CUPTI gives; about 1.5 to 2.5 host ops per launch and 250 bytes per event, as in HTA's real
exports).

Each step of each rank: a ProfilerStep range; a host-to-device copy; a forward pass of
``layers`` ``aten::linear`` ops (each an ``aten::t`` view chain and an ``aten::addmm``
launching a GEMM kernel, with input shapes and a fwdbwd flow); a backward pass on the
autograd thread (``evaluate_function`` -> ``AddmmBackward0`` -> ``aten::mm`` -> a kernel, two
per layer), with DDP's gradient all-reduce every ``bucket``
layers (``c10d::allreduce_`` -> ``record_param_comms`` with its sequence number ->
``ncclDevKernel_AllReduce_*`` on the NCCL stream, overlapping the backward kernels); an
optimizer step (``Optimizer.step#AdamW.step``) with a memset. Every rank issues the same
collectives in the same order, so they match across ranks; ranks start a little apart.

    python benchmarks/kineto_exports.py OUT --ranks 4 --mb 10
"""
from __future__ import annotations

import argparse
import os
import sys

BASE_NS = 1_750_000_000_000_000_000
PID = 4242


def _x(cat: str, name: str, tid: int, ts: float, dur: float, args: str, pid: int = PID) -> str:
    return (f'  {{\n    "ph": "X", "cat": "{cat}", "name": "{name}", "pid": {pid}, '
            f'"tid": {tid},\n    "ts": {ts:.3f}, "dur": {dur:.3f},\n    "args": {{\n'
            f'      {args}\n    }}\n  }}')


def _flow(ph: str, cat: str, fid: int, tid: int, ts: float, end: bool) -> str:
    bp = ', "bp": "e"' if end else ""
    return (f'  {{\n    "ph": "{ph}", "id": {fid}, "pid": {PID}, "tid": {tid}, '
            f'"ts": {ts:.3f}, "cat": "{cat}", "name": "{cat}"{bp}\n  }}')


class _Rank:
    """The events of one rank, step by step; ids counted as torch counts them."""

    def __init__(self, rank: int, world: int, layers: int, bucket: int):
        self.rank, self.world, self.layers, self.bucket = rank, world, layers, bucket
        self.corr = self.ext = self.seq = self.coll = 0
        self.main, self.autograd = 1000 + rank, 2000 + rank

    def _launch(self, tid: int, t: float, kernel: str, stream: int, k_start: float,
                k_dur: float, cat: str = "kernel") -> list:
        self.corr += 1
        c = self.corr
        # the fields CUPTI gives and torch writes for each kernel
        kargs = f'"External id": {self.ext}, "queued": 0, "device": {self.rank % 8}, ' \
                f'"context": 1, "stream": {stream}, "correlation": {c}, ' \
                f'"registers per thread": 168, "shared memory": 100352, "blocks per SM": ' \
                f'0.969697, "warps per SM": 7.757576, "grid": [128, 1, 1], "block": ' \
                f'[256, 1, 1], "est. achieved occupancy %": 12'
        if cat != "kernel":
            kargs = f'"External id": {self.ext}, "device": {self.rank % 8}, "context": 1, ' \
                    f'"stream": {stream}, "correlation": {c}, "bytes": 4194304, ' \
                    f'"memory bandwidth (GB/s)": 139.810133'

        return [_x("cuda_runtime", "cudaLaunchKernel", tid, t, 3.5,
                   f'"External id": {self.ext}, "cbid": 211, "correlation": {c}'),
                _flow("s", "ac2g", c, tid, t, False),
                _x(cat, kernel, stream, k_start, k_dur, kargs, pid=self.rank % 8),
                _flow("f", "ac2g", c, stream, k_start, True)]

    def _view(self, tid: int, t: float) -> list:
        """aten::t -> aten::transpose -> aten::as_strided: host-only ops, as torch nests them."""
        self.ext += 3
        dims = '"Input Dims": [[4096, 4096]], "Input type": ["c10::BFloat16"], ' \
               '"Input Strides": [[4096, 1]], "Concrete Inputs": [""]'
        return [_x("cpu_op", name, tid, t + 0.3 * k, 2.0 - 0.5 * k,
                   f'"External id": {self.ext - 2 + k}, "Record function id": 0, {dims}')
                for k, name in enumerate(("aten::t", "aten::transpose", "aten::as_strided"))]

    def step(self, n: int, t0: float) -> tuple:
        """(events of step ``n`` starting at ``t0`` µs, its end)."""
        out, t = [], t0
        gpu = t0 + 40.0
        out.append(None)                                   # the ProfilerStep range, below
        self.ext += 1
        out += self._launch(self.main, t + 2, "Memcpy HtoD (Pageable -> Device)", 7, gpu, 30.0,
                            cat="gpu_memcpy")
        gpu += 30.0
        t += 10
        fwd = []
        for layer in range(self.layers):
            self.ext += 1
            self.seq += 1
            shapes = '"Input Dims": [[8, 4096], [4096, 4096], [4096]], ' \
                     '"Input type": ["c10::BFloat16", "c10::BFloat16", "c10::BFloat16"]'
            out.append(_x("cpu_op", "aten::linear", self.main, t, 30.0,
                          f'"External id": {self.ext}, "Sequence number": {self.seq}, '
                          f'"Fwd thread id": 0, "Record function id": 0, {shapes}'))
            out += self._view(self.main, t + 1)
            out.append(_x("cpu_op", "aten::addmm", self.main, t + 5, 20.0,
                          f'"External id": {self.ext + 1}, "Sequence number": {self.seq}, '
                          f'"Record function id": 0, "Concrete Inputs": ["", "", "", "1", '
                          f'"1"], {shapes}, "Input Strides": [[1], [4096, 1], [1, 4096]]'))
            out.append(_flow("s", "fwdbwd", self.seq, self.main, t + 5, False))
            fwd.append(self.seq)
            out += self._launch(self.main, t + 10, "sm90_xmma_gemm_bf16bf16_bf16f32", 7, gpu,
                                55.0)
            gpu += 60.0
            t += 35
        t += 20
        for layer, seq in enumerate(reversed(fwd)):
            self.ext += 1
            out.append(_x("cpu_op", "autograd::engine::evaluate_function: AddmmBackward0",
                          self.autograd, t, 50.0, f'"External id": {self.ext}, '
                          f'"Sequence number": {seq}, "Fwd thread id": 1'))
            out.append(_flow("f", "fwdbwd", seq, self.autograd, t, True))
            out.append(_x("cpu_op", "AddmmBackward0", self.autograd, t + 1, 48.0,
                          f'"External id": {self.ext}, "Record function id": 0'))
            for k in range(2):
                out.append(_x("cpu_op", "aten::mm", self.autograd, t + 5 + 20 * k, 15.0,
                              f'"External id": {self.ext}, "Input Dims": [[8, 4096], '
                              f'[4096, 4096]], "Input type": ["c10::BFloat16", '
                              f'"c10::BFloat16"]'))
                out += self._launch(self.autograd, t + 8 + 20 * k,
                                    "sm90_xmma_gemm_bf16bf16_bf16f32_nt", 7, gpu, 55.0)
                gpu += 60.0
            if layer % self.bucket == self.bucket - 1:
                out += self._allreduce(t + 50, gpu - 100.0)
            t += 60
        t += 10
        self.ext += 1
        out.append(_x("user_annotation", "Optimizer.step#AdamW.step", self.main, t, 80.0,
                      f'"External id": {self.ext}'))
        out.append(_x("cpu_op", "aten::_foreach_add_", self.main, t + 5, 60.0,
                      f'"External id": {self.ext + 1}'))
        out += self._launch(self.main, t + 10, "Memset (Device)", 7, gpu, 4.0,
                            cat="gpu_memset")
        out += self._launch(self.main, t + 20, "multi_tensor_apply_kernel", 7, gpu + 5, 90.0)
        end = max(t + 90, gpu + 100)
        self.ext += 1
        out[0] = _x("user_annotation", f"ProfilerStep#{n}", self.main, t0, end - t0,
                    f'"External id": {self.ext}')
        return out, end + 50

    def _allreduce(self, t: float, gpu: float) -> list:
        self.ext += 1
        self.coll += 1
        ranks = "[" + ", ".join(map(str, range(self.world))) + "]"
        out = [_x("cpu_op", "autograd::engine::evaluate_function: torch::autograd::"
                  "AccumulateGrad", self.autograd, t, 40.0, f'"External id": {self.ext}'),
               _x("cpu_op", "c10d::allreduce_", self.autograd, t + 2, 30.0,
                  f'"External id": {self.ext + 1}, "Input Dims": [[[16777216]], [], [], [], '
                  f'[]], "Input type": ["TensorList", "", "", "", ""]'),
               _x("cpu_op", "record_param_comms", self.autograd, t + 4, 25.0,
                  f'"External id": {self.ext + 2}, "Collective name": "allreduce", '
                  f'"dtype": "BFloat16", "In msg nelems": 16777216, "Out msg nelems": '
                  f'16777216, "Group size": {self.world}, "Process Group Name": "0", '
                  f'"Process Group Description": "default_pg", "Process Group Ranks": '
                  f'"{ranks}", "Seq": {self.coll}'),
               _x("user_annotation", "nccl:all_reduce", self.autograd, t + 6, 15.0,
                  f'"External id": {self.ext + 3}')]
        skew = 20.0 * (self.rank % 4)
        return out + self._launch(self.autograd, t + 10,
                                  "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 20,
                                  gpu + skew, 400.0)


def write_rank(path: str, rank: int, world: int, mb: float, layers: int = 24,
               bucket: int = 6) -> int:
    """One rank's export of about ``mb`` MB of JSON at ``path``; returns its bytes."""
    r = _Rank(rank, world, layers, bucket)
    ranks = ", ".join(map(str, range(world)))
    head = ('{\n  "schemaVersion": 1,\n  "deviceProperties": [\n    {"id": 0, "name": '
            '"NVIDIA H100 80GB HBM3", "totalGlobalMem": 85029158912}\n  ],\n'
            f'  "distributedInfo": {{"backend": "nccl", "rank": {rank}, "world_size": {world}, '
            f'"pg_count": 1, "pg_config": [{{"pg_name": "0", "pg_desc": "default_pg", '
            f'"backend_config": "cuda:nccl", "pg_size": {world}, "ranks": [{ranks}]}}], '
            f'"nccl_version": "2.21.5"}},\n  "record_shapes": 1,\n  "traceEvents": [\n')
    target = int(mb * 1e6)
    size = 0
    with open(path, "w") as fh:
        fh.write(head)
        size += len(head)
        t, n, first = 1_000_000.0 + 37.0 * rank, 100, True
        while size < target:
            events, t = r.step(n, t)
            text = (",\n" if not first else "") + ",\n".join(events)
            fh.write(text)
            size += len(text)
            first, n = False, n + 1
        tail = ('\n  ],\n  "traceName": "rank-%d.pt.trace.json",\n  "displayTimeUnit": "ms",'
                '\n  "baseTimeNanoseconds": %d\n}\n' % (rank, BASE_NS))
        fh.write(tail)
    return os.path.getsize(path)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--mb", type=float, default=10.0, help="MB of JSON a rank")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    for rank in range(args.ranks):
        write_rank(os.path.join(args.out, f"rank-{rank}.json"), rank, args.ranks, args.mb)
    return 0


if __name__ == "__main__":
    sys.exit(main())
