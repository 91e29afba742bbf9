"""CUPTI's activity records as NVIDIA's headers define them, transcribed field by field
(cupti_activity.h and cupti_activity_deprecated.h of CUDA 12.6 to 13.2 alike), the callback ids
of a few runtime and driver calls (cupti_runtime_cbid.h, cupti_driver_cbid.h), the activity
kinds and result codes: what the stand-in libcupti (cupti_standin.c) hands
tracer/recorder/csrc/cupti/cupti.c. Independent of the module's own ``layout()``:
tests/integration/test_cupti_layout.py compiles each field's offset, each struct's size, each
id and each constant against every CUPTI header set it finds and compares them with these."""
from __future__ import annotations

import struct

# (struct name, [(field, struct format)...]) in declaration order. PACKED_ALIGNMENT (GCC:
# __packed__ and aligned(8)): no padding between fields, the size rounded up to 8. x86_64
# defines CUPTILP64, so the Memcpy and Memset records have their ``pad``.
KERNEL4 = ("CUpti_ActivityKernel4", [
    ("kind", "I"), ("cacheConfig", "B"), ("sharedMemoryConfig", "B"),
    ("registersPerThread", "H"), ("partitionedGlobalCacheRequested", "i"),
    ("partitionedGlobalCacheExecuted", "i"), ("start", "Q"), ("end", "Q"), ("completed", "Q"),
    ("deviceId", "I"), ("contextId", "I"), ("streamId", "I"), ("gridX", "i"), ("gridY", "i"),
    ("gridZ", "i"), ("blockX", "i"), ("blockY", "i"), ("blockZ", "i"),
    ("staticSharedMemory", "i"), ("dynamicSharedMemory", "i"), ("localMemoryPerThread", "I"),
    ("localMemoryTotal", "I"), ("correlationId", "I"), ("gridId", "q"), ("name", "Q"),
    ("reserved0", "Q"), ("queued", "Q"), ("submitted", "Q"), ("launchType", "B"),
    ("isSharedMemoryCarveoutRequested", "B"), ("sharedMemoryCarveoutRequested", "B"),
    ("padding", "B"), ("sharedMemoryExecuted", "I")])
MEMCPY = ("CUpti_ActivityMemcpy", [
    ("kind", "I"), ("copyKind", "B"), ("srcKind", "B"), ("dstKind", "B"), ("flags", "B"),
    ("bytes", "Q"), ("start", "Q"), ("end", "Q"), ("deviceId", "I"), ("contextId", "I"),
    ("streamId", "I"), ("correlationId", "I"), ("runtimeCorrelationId", "I"), ("pad", "I"),
    ("reserved0", "Q")])
MEMSET = ("CUpti_ActivityMemset", [
    ("kind", "I"), ("value", "I"), ("bytes", "Q"), ("start", "Q"), ("end", "Q"),
    ("deviceId", "I"), ("contextId", "I"), ("streamId", "I"), ("correlationId", "I"),
    ("flags", "H"), ("memoryKind", "H"), ("pad", "I"), ("reserved0", "Q")])
API = ("CUpti_ActivityAPI", [
    ("kind", "I"), ("cbid", "I"), ("start", "Q"), ("end", "Q"), ("processId", "I"),
    ("threadId", "I"), ("correlationId", "I"), ("returnValue", "I")])
LAYOUTS = (KERNEL4, MEMCPY, MEMSET, API)

# CUpti_ActivityKind, CUpti_CallbackDomain, CUptiResult, CUpti_ActivityFlag
CONSTANTS = {
    "CUPTI_ACTIVITY_KIND_MEMCPY": 1, "CUPTI_ACTIVITY_KIND_MEMSET": 2,
    "CUPTI_ACTIVITY_KIND_DRIVER": 4, "CUPTI_ACTIVITY_KIND_RUNTIME": 5,
    "CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL": 10, "CUPTI_CB_DOMAIN_DRIVER_API": 1,
    "CUPTI_CB_DOMAIN_RUNTIME_API": 2, "CUPTI_SUCCESS": 0, "CUPTI_ERROR_INVALID_PARAMETER": 1,
    "CUPTI_ERROR_MAX_LIMIT_REACHED": 12, "CUPTI_ERROR_NOT_INITIALIZED": 15,
    "CUPTI_ERROR_UNKNOWN": 999, "CUPTI_ACTIVITY_FLAG_FLUSH_FORCED": 1}
KIND = {"memcpy": 1, "memset": 2, "driver": 4, "runtime": 5, "kernel": 10}
KIND_UNKNOWN = 63                 # a kind no CUPTI of these defines: a later one's
UNKNOWN_BYTES = 48
# (domain, name) -> callback id: the cbid headers' CUPTI_RUNTIME_TRACE_CBID_<name> and
# CUPTI_DRIVER_TRACE_CBID_<name>
RUNTIME, DRIVER = 2, 1
CALLS = {
    (RUNTIME, "cudaGetDevice_v3020"): 17, (RUNTIME, "cudaMemcpyAsync_v3020"): 41,
    (RUNTIME, "cudaMemsetAsync_v3020"): 51, (RUNTIME, "cudaStreamSynchronize_v3020"): 131,
    (RUNTIME, "cudaLaunchKernel_v7000"): 211, (RUNTIME, "cudaGraphLaunch_v10000"): 311,
    (RUNTIME, "cudaLaunchKernelExC_v11060"): 430, (DRIVER, "cuCtxGetDevice"): 16,
    (DRIVER, "cuMemcpyHtoD_v2"): 276, (DRIVER, "cuCtxGetCurrent"): 304,
    (DRIVER, "cuLaunchKernel"): 307, (DRIVER, "cuLaunchKernelEx"): 652}


def offsets(layout: tuple) -> dict:
    """Each field's offset in the packed struct."""
    out, at = {}, 0
    for field, fmt in layout[1]:
        out[field] = at
        at += struct.calcsize("<" + fmt)
    return out


def size(layout: tuple) -> int:
    """sizeof the struct: its packed fields, rounded up to 8."""
    end = sum(struct.calcsize("<" + fmt) for _, fmt in layout[1])
    return (end + 7) // 8 * 8


def pack(layout: tuple, **values) -> bytes:
    """A record's bytes: the fields given, zeros elsewhere."""
    fields = dict(layout[1])
    unknown = set(values) - set(fields)
    if unknown:
        raise KeyError(f"{layout[0]} has no {sorted(unknown)}")
    out = bytearray(size(layout))
    at = offsets(layout)
    for field, value in values.items():
        struct.pack_into("<" + fields[field], out, at[field], value)
    return bytes(out)
