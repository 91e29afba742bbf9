/* The tracer.recorder._cupti module: CUPTI's activity API driven directly, with no Kineto
 * session to stop (tracer/recorder/device_direct.py says how the recorder uses it).
 *
 * CUPTI fills buffers this module hands it and gives each full one back on a thread of its
 * own (every flush period, or at a flush). The completion callback turns the records it keeps
 * (kernels, memcpys, memsets and the runtime and driver calls that launch them) into rows of
 * nine int64 columns, the order of tracer.files.device_format's, under a mutex and without the
 * GIL; the recorder's flusher drains them. Nothing here runs on the training thread but the
 * start, the stop and the final flush.
 *
 * No CUPTI header is needed to build it: libcupti is the one torch's CUDA build already loaded
 * (dlopen of its path), and the records are read through the prefixes in cuptirecords.h.
 * NOTE: those prefixes are CUPTI's own layouts, unchanged since CUDA 10 in every later record
 * version (CUpti_ActivityKernel4 to 10, Memcpy to Memcpy6, Memset to Memset4, API); new fields
 * were only appended. tests/integration/test_cupti_layout.py compiles against the headers of
 * every CUPTI it finds (the nvidia-cuda-cupti wheels, triton's copy) and compares offsets.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuptirecords.h"

static const uint32_t KINDS_ON[] = {K_CONCURRENT_KERNEL, K_MEMCPY, K_MEMSET, K_RUNTIME, K_DRIVER};
#define N_KINDS_ON 5

static PyObject *
cupti_error(const char *call, int result)
{
    const char *text = NULL;
    if (cupti.result_string == NULL || cupti.result_string(result, &text) != CUPTI_OK)
        text = NULL;
    return PyErr_Format(PyExc_RuntimeError, "%s: %s (%d)", call, text ? text : "CUPTI error",
                        result);
}

static PyObject *
cupti_load(PyObject *self, PyObject *arg)
{
    const char *path = PyUnicode_AsUTF8(arg);
    if (path == NULL)
        return NULL;
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (lib == NULL)
        return PyErr_Format(PyExc_OSError, "%s", dlerror());
#define SYM(field, name, required) \
    do { *(void **)&cupti.field = dlsym(lib, name); \
         if (required && cupti.field == NULL) \
             return PyErr_Format(PyExc_OSError, "%s: no %s", path, name); } while (0)
    SYM(get_version, "cuptiGetVersion", 1);
    SYM(enable, "cuptiActivityEnable", 1);
    SYM(disable, "cuptiActivityDisable", 1);
    SYM(register_callbacks, "cuptiActivityRegisterCallbacks", 1);
    SYM(next_record, "cuptiActivityGetNextRecord", 1);
    SYM(dropped, "cuptiActivityGetNumDroppedRecords", 1);
    SYM(flush_all, "cuptiActivityFlushAll", 1);
    SYM(timestamp, "cuptiGetTimestamp", 1);
    SYM(flush_period, "cuptiActivityFlushPeriod", 0);
    SYM(register_timestamp, "cuptiActivityRegisterTimestampCallback", 0);
    SYM(callback_name, "cuptiGetCallbackName", 0);
    SYM(result_string, "cuptiGetResultString", 0);
#undef SYM
    uint32_t version = 0;
    int r = cupti.get_version(&version);
    if (r != CUPTI_OK)
        return cupti_error("cuptiGetVersion", r);
    return PyLong_FromUnsignedLong(version);
}

/* CUPTI's clock while this module records: CLOCK_REALTIME, so that records are Unix ns.
 * Kineto registers a clock of its own at each profiler start (the TSC's ticks, which its export
 * converts): a torch.profiler run earlier in the process leaves records in ticks, not ns
 * (seen on an H200, torch 2.11: kernels seconds off their launches). So every start sets it. */
static uint64_t
unix_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static int own_clock = 0;       /* unix_ns is CUPTI's clock (set by the latest start) */

static PyObject *
cupti_start(PyObject *self, PyObject *args)
{
    Py_ssize_t bytes;
    unsigned int period_ms;
    if (!PyArg_ParseTuple(args, "nI", &bytes, &period_ms))
        return NULL;
    if (cupti.enable == NULL)
        return PyErr_Format(PyExc_RuntimeError, "libcupti is not loaded");
    set_buffer_bytes(bytes > 0 ? (size_t)bytes : 0);
    /* before any kind is enabled, as CUPTI asks; where it cannot be set, each drain pairs
     * CUPTI's own clock with CLOCK_REALTIME instead (clock() below) */
    own_clock = cupti.register_timestamp != NULL && cupti.register_timestamp(unix_ns) == CUPTI_OK;
    int r = cupti.register_callbacks(buffer_requested, buffer_completed);
    if (r != CUPTI_OK)
        return cupti_error("cuptiActivityRegisterCallbacks", r);
    for (int i = 0; i < N_KINDS_ON; i++)
        if ((r = cupti.enable(KINDS_ON[i])) != CUPTI_OK) {
            for (int j = 0; j < i; j++)
                cupti.disable(KINDS_ON[j]);
            return cupti_error("cuptiActivityEnable", r);
        }
    if (cupti.flush_period != NULL && period_ms)
        cupti.flush_period(period_ms);    /* CUPTI's own thread hands buffers back */
    Py_RETURN_NONE;
}

static PyObject *
cupti_stop(PyObject *self, PyObject *unused)
{
    if (cupti.disable != NULL)
        for (int i = 0; i < N_KINDS_ON; i++)
            cupti.disable(KINDS_ON[i]);
    Py_RETURN_NONE;
}

static PyObject *
cupti_flush(PyObject *self, PyObject *forced)
{
    if (cupti.flush_all == NULL)
        Py_RETURN_NONE;
    int r;
    uint32_t flag = PyObject_IsTrue(forced) ? FLUSH_FORCED : 0;
    Py_BEGIN_ALLOW_THREADS        /* the completion callback runs here, without the GIL */
    r = cupti.flush_all(flag);
    Py_END_ALLOW_THREADS
    if (r != CUPTI_OK)
        return cupti_error("cuptiActivityFlushAll", r);
    Py_RETURN_NONE;
}

/* (rows as bytes, names interned since the last drain, rows lost, records CUPTI dropped) */
static PyObject *
cupti_drain(PyObject *self, PyObject *unused)
{
    size_t n, first, last;
    int64_t lost, dropped;
    PyObject *data = NULL, *fresh = NULL;
    pthread_mutex_lock(&cupti_lock);      /* CUPTI's thread may grow the names meanwhile */
    Row *taken = take_rows(&n, &first, &last, &lost, &dropped);
    fresh = PyList_New((Py_ssize_t)(last - first));
    for (size_t i = first; fresh != NULL && i < last; i++) {
        const char *name = name_at(i);
        PyObject *text = PyUnicode_DecodeUTF8(name, (Py_ssize_t)strlen(name), "replace");
        if (text == NULL)
            Py_CLEAR(fresh);
        else
            PyList_SET_ITEM(fresh, (Py_ssize_t)(i - first), text);
    }
    pthread_mutex_unlock(&cupti_lock);
    data = PyBytes_FromStringAndSize((const char *)taken, (Py_ssize_t)(n * sizeof(Row)));
    free(taken);
    if (data == NULL || fresh == NULL)
        goto fail;
    return Py_BuildValue("(NNLL)", data, fresh, (long long)lost, (long long)dropped);
fail:
    Py_XDECREF(data);
    Py_XDECREF(fresh);
    return NULL;
}

/* (CUPTI's clock, CLOCK_REALTIME) read together, in ns: one reading twice where CUPTI's clock
 * is this module's own (see unix_ns) */
static PyObject *
cupti_clock(PyObject *self, PyObject *unused)
{
    uint64_t t = 0;
    if (cupti.timestamp == NULL)
        return PyErr_Format(PyExc_RuntimeError, "libcupti is not loaded");
    if (own_clock) {
        t = unix_ns();
        return Py_BuildValue("(KK)", (unsigned long long)t, (unsigned long long)t);
    }
    int r = cupti.timestamp(&t);
    uint64_t unix_t = unix_ns();
    if (r != CUPTI_OK)
        return cupti_error("cuptiGetTimestamp", r);
    return Py_BuildValue("(KK)", (unsigned long long)t, (unsigned long long)unix_t);
}

/* whether CUPTI's clock is this module's CLOCK_REALTIME (False before the first start, or
 * where CUPTI has no cuptiActivityRegisterTimestampCallback) */
static PyObject *
cupti_own_clock(PyObject *self, PyObject *unused)
{
    return PyBool_FromLong(own_clock);
}

/* Tests: one record's bytes, as CUPTI lays them out, through the completion path's take(). */
static PyObject *
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
    pthread_mutex_lock(&cupti_lock);
    take(copy);
    pthread_mutex_unlock(&cupti_lock);
    free(copy);
    Py_RETURN_NONE;
}

/* Tests: the offsets and constants this module reads, to compare with CUPTI's headers. */
static PyObject *
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

static PyMethodDef cupti_functions[] = {
    {"load", cupti_load, METH_O, "load(path): libcupti's calls; returns cuptiGetVersion's."},
    {"start", cupti_start, METH_VARARGS,
     "start(buffer_bytes, flush_period_ms): register the buffers, enable the kinds."},
    {"stop", cupti_stop, METH_NOARGS, "Disable the kinds (records under way still come)."},
    {"flush", cupti_flush, METH_O, "flush(forced): cuptiActivityFlushAll, without the GIL."},
    {"drain", cupti_drain, METH_NOARGS,
     "(rows bytes, new names, rows lost, records CUPTI dropped) since the last drain."},
    {"clock", cupti_clock, METH_NOARGS, "(cuptiGetTimestamp, CLOCK_REALTIME) in ns."},
    {"own_clock", cupti_own_clock, METH_NOARGS, "Whether CUPTI's clock is CLOCK_REALTIME."},
    {"take_record", cupti_take_record, METH_O, "Tests: one record through the parse."},
    {"layout", cupti_layout, METH_NOARGS, "Tests: the record offsets and constants read."},
    {NULL},
};

static struct PyModuleDef cupti_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "tracer.recorder._cupti",
    .m_doc = "CUPTI's activity API without Kineto (tracer/recorder/device_direct.py).",
    .m_size = -1,
    .m_methods = cupti_functions,
};

PyMODINIT_FUNC
PyInit__cupti(void)
{
    PyObject *module = PyModule_Create(&cupti_module);
    if (module != NULL && PyModule_AddIntConstant(module, "ROW_BYTES", sizeof(Row)) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
