/* What tests ask of tracer.recorder._cupti (cupti.c has the module): a record through the
 * parse, the offsets read, the counters behind the hardening, and allocations that fail.
 * Nothing here runs while the recorder records. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdlib.h>
#include <string.h>

#include "cuptirecords.h"

size_t calls_enabled(int d);               /* cupti.c */

/* One record's bytes, as CUPTI lays them out, through the completion path's take(). */
PyObject *
cupti_take_record(PyObject *self, PyObject *arg)
{
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    void *copy = NULL;
    size_t need = view.len > (Py_ssize_t)sizeof(KernelRecord) ? (size_t)view.len
                                                               : sizeof(KernelRecord);
    if (posix_memalign(&copy, 8, need) != 0) {
        PyBuffer_Release(&view);
        return PyErr_NoMemory();
    }
    memset(copy, 0, need);
    memcpy(copy, view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&cupti_lock);
    take(copy);
    pthread_mutex_unlock(&cupti_lock);
    Py_END_ALLOW_THREADS
    free(copy);
    Py_RETURN_NONE;
}

/* The offsets and constants this module reads, to compare with CUPTI's headers. */
PyObject *
cupti_layout(PyObject *self, PyObject *unused)
{
    static const struct { const char *key; size_t value; } LAYOUT[] = {
        {"CUpti_ActivityKernel.start", offsetof(KernelRecord, start)},
        {"CUpti_ActivityKernel.end", offsetof(KernelRecord, end)},
        {"CUpti_ActivityKernel.deviceId", offsetof(KernelRecord, device)},
        {"CUpti_ActivityKernel.streamId", offsetof(KernelRecord, stream)},
        {"CUpti_ActivityKernel.correlationId", offsetof(KernelRecord, correlation)},
        {"CUpti_ActivityKernel.name", offsetof(KernelRecord, name)},
        {"CUpti_ActivityMemcpy.copyKind", offsetof(MemcpyRecord, copy_kind)},
        {"CUpti_ActivityMemcpy.srcKind", offsetof(MemcpyRecord, src_kind)},
        {"CUpti_ActivityMemcpy.dstKind", offsetof(MemcpyRecord, dst_kind)},
        {"CUpti_ActivityMemcpy.bytes", offsetof(MemcpyRecord, bytes)},
        {"CUpti_ActivityMemcpy.start", offsetof(MemcpyRecord, start)},
        {"CUpti_ActivityMemcpy.end", offsetof(MemcpyRecord, end)},
        {"CUpti_ActivityMemcpy.deviceId", offsetof(MemcpyRecord, device)},
        {"CUpti_ActivityMemcpy.streamId", offsetof(MemcpyRecord, stream)},
        {"CUpti_ActivityMemcpy.correlationId", offsetof(MemcpyRecord, correlation)},
        {"CUpti_ActivityMemset.bytes", offsetof(MemsetRecord, bytes)},
        {"CUpti_ActivityMemset.start", offsetof(MemsetRecord, start)},
        {"CUpti_ActivityMemset.end", offsetof(MemsetRecord, end)},
        {"CUpti_ActivityMemset.deviceId", offsetof(MemsetRecord, device)},
        {"CUpti_ActivityMemset.streamId", offsetof(MemsetRecord, stream)},
        {"CUpti_ActivityMemset.correlationId", offsetof(MemsetRecord, correlation)},
        {"CUpti_ActivityMemset.memoryKind", offsetof(MemsetRecord, memory_kind)},
        {"CUpti_ActivityAPI.cbid", offsetof(ApiRecord, cbid)},
        {"CUpti_ActivityAPI.start", offsetof(ApiRecord, start)},
        {"CUpti_ActivityAPI.end", offsetof(ApiRecord, end)},
        {"CUpti_ActivityAPI.threadId", offsetof(ApiRecord, thread)},
        {"CUpti_ActivityAPI.correlationId", offsetof(ApiRecord, correlation)},
        {"CUPTI_ACTIVITY_KIND_MEMCPY", K_MEMCPY}, {"CUPTI_ACTIVITY_KIND_MEMSET", K_MEMSET},
        {"CUPTI_ACTIVITY_KIND_DRIVER", K_DRIVER}, {"CUPTI_ACTIVITY_KIND_RUNTIME", K_RUNTIME},
        {"CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL", K_CONCURRENT_KERNEL},
        {"CUPTI_CB_DOMAIN_DRIVER_API", DOMAIN_DRIVER},
        {"CUPTI_CB_DOMAIN_RUNTIME_API", DOMAIN_RUNTIME}, {"CUPTI_SUCCESS", CUPTI_OK},
        {"CUPTI_ERROR_MAX_LIMIT_REACHED", CUPTI_END_OF_BUFFER},
        {"CUPTI_ACTIVITY_FLAG_FLUSH_FORCED", FLUSH_FORCED},
    };
    PyObject *out = PyDict_New();
    for (size_t i = 0; out != NULL && i < sizeof LAYOUT / sizeof *LAYOUT; i++) {
        PyObject *value = PyLong_FromSize_t(LAYOUT[i].value);
        if (value == NULL || PyDict_SetItemString(out, LAYOUT[i].key, value) < 0)
            Py_CLEAR(out);
        Py_XDECREF(value);
    }
    return out;
}

/* {buffers_out: handed to CUPTI and not back, demangled: __cxa_demangle calls so far,
 *  driver_calls, runtime_calls: the calls the latest start enabled one by one} */
PyObject *
cupti_counters(PyObject *self, PyObject *unused)
{
    int64_t demangled;
    size_t out;
    Py_BEGIN_ALLOW_THREADS
    out = buffers_out();
    pthread_mutex_lock(&cupti_lock);
    demangled = names_demangled();
    pthread_mutex_unlock(&cupti_lock);
    Py_END_ALLOW_THREADS
    return Py_BuildValue("{snsLsnsn}", "buffers_out", (Py_ssize_t)out,
                         "demangled", (long long)demangled,
                         "driver_calls", (Py_ssize_t)calls_enabled(0),
                         "runtime_calls", (Py_ssize_t)calls_enabled(1));
}

PyObject *
cupti_fail_allocations(PyObject *self, PyObject *arg)
{
    long after = PyLong_AsLong(arg);
    if (after == -1 && PyErr_Occurred())
        return NULL;
    fail_allocations(after);
    Py_RETURN_NONE;
}
